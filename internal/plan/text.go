package plan

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/tfstackplan/tfstackplan/events"
)

// ANSI styles of the terminal render.
const (
	ansiReset  = "\x1b[0m"
	ansiBold   = "\x1b[1m"
	ansiRed    = "\x1b[31m"
	ansiGreen  = "\x1b[32m"
	ansiYellow = "\x1b[33m"
	ansiMagent = "\x1b[35m"
)

type painter bool

func (p painter) paint(style, s string) string {
	if !p || style == "" {
		return s
	}
	return style + s + ansiReset
}

func classStyle(c events.Class) string {
	switch c {
	case events.ClassAdditive:
		return ansiGreen
	case events.ClassMutating:
		return ansiYellow
	case events.ClassDestructive:
		return ansiBold + ansiRed
	case events.ClassUnclassified:
		return ansiBold + ansiMagent
	}
	return ""
}

func actionStyle(line string) string {
	switch {
	case strings.HasPrefix(line, ActionCreate.Symbol()):
		return ansiGreen
	case strings.HasPrefix(line, ActionUpdate.Symbol()), strings.HasPrefix(line, ActionMove.Symbol()):
		return ansiYellow
	case strings.HasPrefix(line, ActionReplace.Symbol()), strings.HasPrefix(line, ActionDelete.Symbol()),
		strings.HasPrefix(line, ActionForget.Symbol()):
		return ansiRed
	}
	return ""
}

// Text renders r for a terminal; color adds ANSI colours (pass true only for a TTY).
func Text(w io.Writer, r *Report, color bool) error {
	p := painter(color)
	sec := r.secrets()
	about := subject(r, Printable)
	r = r.redacted(sec)
	var b strings.Builder
	if about != "" {
		about += ":"
	}
	partial := ""
	if partialReport(r) {
		partial = " (partial plan)"
	}
	fmt.Fprintf(&b, "%s %s%s\n", p.paint(ansiBold, strings.TrimSpace("tfstackplan: "+about)), p.paint(classStyle(r.Class()), string(r.Class())), partial)
	fmt.Fprintf(&b, "Totals: %s\n", totalsLine(r, ", "))
	if list, omitted := destructiveList(r); len(list)+omitted > 0 {
		fmt.Fprintf(&b, "\n%s\n", p.paint(ansiBold+ansiRed, fmt.Sprintf("WARNING: %s",
			plural(len(list)+omitted, "destructive change", "destructive changes"))))
		for _, e := range list {
			fmt.Fprintf(&b, "  %s: %s\n", Printable(e.stack), p.paint(ansiRed, e.change.Head()))
		}
		if omitted > 0 {
			fmt.Fprintf(&b, "  … and %d more\n", omitted)
		}
	}
	for _, s := range r.Stacks {
		fmt.Fprintf(&b, "\n%s  %s  %s\n", p.paint(ansiBold, Printable(s.Name)), p.paint(classStyle(s.Class), string(s.Class)), shortCounts(s.Counts))
		if s.Error != "" {
			fmt.Fprintf(&b, "  %s %s\n", p.paint(ansiBold+ansiMagent, "error:"), Printable(s.Error))
		}
		if len(s.Why) > 0 {
			fmt.Fprintf(&b, "  why: %s\n", Printable(strings.Join(s.Why, "; ")))
		}
		for _, w := range stackWarnings(s) {
			fmt.Fprintf(&b, "  %s %s\n", p.paint(ansiBold+ansiYellow, "warning:"), Printable(w))
		}
		for _, line := range detailLines(s, true, r.ExecutionURL) {
			if line == "" {
				b.WriteString("\n")
				continue
			}
			// Attribute paths and output names come from the plan: no control characters.
			line = Printable(line)
			fmt.Fprintf(&b, "  %s\n", p.paint(actionStyle(line), line))
		}
	}
	if r.ExecutionURL != "" {
		fmt.Fprintf(&b, "\nExecution: %s\n", Printable(r.ExecutionURL))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// jsonReport is the JSON render's document.
type jsonReport struct {
	Class          events.Class `json:"class"`
	Totals         Counts       `json:"totals"`
	OutputsChanged int          `json:"outputs_changed"`
	Drift          int          `json:"drift"`
	ExecutionURL   string       `json:"execution_url,omitempty"`
	// Partial: a stack's plan is partial (see Stack.Partial).
	Partial bool     `json:"partial,omitempty"`
	Stacks  []*Stack `json:"stacks"`
}

// JSON renders r as an indented JSON document: the execution's class and totals, and every stack with its class and counts (all seven actions always present, and
// move when there are moves).
func JSON(w io.Writer, r *Report) error {
	sec := r.secrets()
	r = r.redacted(sec)
	doc := jsonReport{
		Class: r.Class(), Totals: r.Totals(),
		OutputsChanged: r.OutputsChanged(), Drift: r.DriftCount(), ExecutionURL: r.ExecutionURL,
		Partial: partialReport(r), Stacks: r.Stacks,
	}
	if doc.Stacks == nil {
		doc.Stacks = []*Stack{}
	}
	// The model is masked value by value: its encoding is never rewritten.
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}
