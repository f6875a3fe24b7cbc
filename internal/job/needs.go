package job

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/runner"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/plan"
)

// What a plan needs before its apply, as the server says after the plan's Finalize, and why its
// failed stacks failed: what the result document, the PR comment, the step summary, the
// annotations and the terminal show of them.

// Bounds of what the comment and the summary show (the result document has everything).
const (
	// MaxLogTailLines and MaxLogTailBytes bound a failed stack's log tail.
	MaxLogTailLines = 30
	MaxLogTailBytes = 4096
	// maxTailsShown is how many failed stacks' tails the comment and the summary show.
	maxTailsShown = 3
	// maxGatesShown and maxConflictsShown bound the gates and conflicts they list.
	maxGatesShown     = 10
	maxConflictsShown = 10
	// maxNamesShown and maxNamesBytes bound the stacks named for one gate or conflict. With the
	// bounds above, the notes stay under 56 KiB whatever the server answers, and the comment
	// (65,536 characters) keeps them whole with the totals.
	maxNamesShown = 20
	maxNamesBytes = 512
	// tailScanLimit bounds how much of a stack's log is read for its `::add-mask::` lines.
	tailScanLimit = 64 << 20
)

// askNeeds asks the server what the plan needs (best-effort: the client's budget and breaker
// bound it, and a failure is only said) and records it in the result.
func (r *run) askNeeds(ctx context.Context) {
	res := r.res
	if res.Op != OpPlan || res.DryRun {
		return
	}
	switch {
	case !r.client.Enabled():
		res.Gates = &GatesNeeded{Status: GatesOffline, Required: []GateNeeded{},
			Message: "No tfstackplan server is configured, so nothing here says which gates this plan needs: the server's policy decides that when the apply asks."}
		return
	case res.Status == StatusCancelled:
		// A cancelled run ends as soon as it can; its plan is not applicable anyway.
		res.Gates = &GatesNeeded{Status: GatesUnavailable, Required: []GateNeeded{},
			Message: "The run was cancelled, so the server was not asked which gates this plan needs."}
		return
	case !r.finalized || r.refusal() != nil || r.initPanic != nil:
		res.Gates = &GatesNeeded{Status: GatesUnavailable, Required: []GateNeeded{},
			Message: "The server has no record of this plan, so it was not asked which gates the plan needs."}
		return
	}
	x, err := r.client.ExecutionGates(context.WithoutCancel(ctx), r.o.ExecutionID)
	if err == nil && (x == nil || x.ExecutionID != r.o.ExecutionID) {
		err = fmt.Errorf("the answer is not about execution %s", r.o.ExecutionID)
	}
	if err != nil {
		r.warn("the server could not say which gates this plan needs: %v", err)
		res.Gates = &GatesNeeded{Status: GatesUnavailable, Required: []GateNeeded{},
			Message: fmt.Sprintf("The server could not say which gates this plan needs (%s); the apply's gate check decides.", truncate(err.Error(), 300))}
		return
	}
	res.Gates, res.Conflicts = r.needsOf(x), conflictsOf(x)
}

// needsOf is the server's answer x as the result document holds it. The answer is the
// server's, not trusted to be well-formed: a gate of no known class is dropped (it could not be
// approved by the command anyway).
func (r *run) needsOf(x *api.ExecutionGates) *GatesNeeded {
	env := r.res.Environment
	g := &GatesNeeded{Status: GatesKnown, Required: []GateNeeded{}, Blocked: truncate(x.Blocked, 1024)}
	if !x.Policy {
		g.Status = GatesNoPolicy
		g.Message = fmt.Sprintf("The server's policy has no environment %q: nothing is gated there.", env)
		return g
	}
	for _, gate := range x.Gates {
		if !api.Class(gate.Class).Valid() {
			continue
		}
		n := GateNeeded{Class: gate.Class, Target: gate.Target, Stacks: gate.Stacks, Satisfied: gate.Satisfied,
			GrantID: gate.GrantID, GrantedBy: gate.GrantedBy, GrantedAt: gate.GrantedAt}
		if n.Stacks == nil {
			n.Stacks = []string{}
		}
		// A plan that cannot be approved gets no way to approve it; grants are per PR.
		if !n.Satisfied && x.Blocked == "" {
			n.ApproveURL = r.res.ExecutionURL
			if x.PR > 0 {
				n.Command = satisfyCommand(x.Repo, env, x.PR, x.ExecutionID, gate.Class, gate.Target)
			}
		}
		g.Required = append(g.Required, n)
	}
	switch open := unsatisfied(g.Required); {
	case len(g.Required) == 0:
		g.Message = fmt.Sprintf("The server's policy for %q requires no gate for this plan.", env)
	case open == 0:
		g.Message = fmt.Sprintf("The server's policy for %q requires %s for this plan; every one is satisfied.", env, plural(len(g.Required), "gate", "gates"))
	default:
		g.Message = fmt.Sprintf("The server's policy for %q requires %s for this plan; %d not satisfied yet.", env, plural(len(g.Required), "gate", "gates"), open)
	}
	return g
}

func unsatisfied(gates []GateNeeded) int {
	n := 0
	for _, g := range gates {
		if !g.Satisfied {
			n++
		}
	}
	return n
}

// conflictsOf is the other PRs' claims of the server's answer x.
func conflictsOf(x *api.ExecutionGates) []Conflict {
	var out []Conflict
	for _, c := range x.Conflicts {
		if c.PR == x.PR || len(c.Stacks) == 0 {
			continue
		}
		out = append(out, Conflict{PR: c.PR, Execution: c.ExecutionID, Stacks: c.Stacks})
	}
	return out
}

// satisfyCommand is the `admin gates satisfy` command that approves one gate of a plan, every
// value quoted for a POSIX shell.
func satisfyCommand(repo, env string, pr int, exec, class, target string) string {
	return fmt.Sprintf("tfstackplan admin gates satisfy --repo %s --environment %s --pr %d --execution %s --class %s --target %s --reason '...'",
		shellQuote(repo), shellQuote(env), pr, shellQuote(exec), shellQuote(class), shellQuote(target))
}

// shellQuote quotes s for a POSIX shell: as it is when it holds only characters no shell
// treats specially, else in single quotes.
func shellQuote(s string) string {
	safe := s != ""
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_./@:+=,", c)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// someNames is up to maxNamesShown of names (at least one, and no more than maxNamesBytes of
// them, each cut at half of that), each through quote, and how many more there are.
func someNames(list []string, quote func(string) string) string {
	shown := make([]string, 0, min(len(list), maxNamesShown))
	size := 0
	for _, n := range list[:min(len(list), maxNamesShown)] {
		q := quote(truncate(n, maxNamesBytes/2))
		if size += len(q) + 2; len(shown) > 0 && size > maxNamesBytes {
			break
		}
		shown = append(shown, q)
	}
	out := strings.Join(shown, ", ")
	if more := len(list) - len(shown); more > 0 {
		out += fmt.Sprintf(" and %d more", more)
	}
	return out
}

// fillLogTails sets the log tail of every failed or cancelled stack, masked with the run's
// masks and every value an `::add-mask::` line of the stack's log announced.
func (r *run) fillLogTails() {
	for i := range r.res.Stacks {
		e := &r.res.Stacks[i]
		if e.Status != StatusFailed && e.Status != StatusCancelled || e.LogTail != "" || r.o.LogFile == "" {
			continue
		}
		file, _, err := r.root.StackFileInfo(e.Path, r.o.LogFile)
		if err != nil {
			continue
		}
		e.LogTail = logTail(file, r.masker)
	}
}

// logTail is the end of the log at path, masked: at most MaxLogTailLines lines and
// MaxLogTailBytes bytes, "" when there is none. The whole log (up to tailScanLimit) is read
// for its `::add-mask::` lines first, so that a value announced early is masked at the end.
func logTail(path string, m *runner.Masker) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return ""
	}
	start := max(0, fi.Size()-tailScanLimit)
	if _, err := f.Seek(start, io.SeekStart); err != nil {
		return ""
	}
	// Line by line; a line longer than the buffer (no value that long could be masked) is
	// skipped whole, and the lines after it are still read.
	br := bufio.NewReaderSize(f, 64<<10)
	var values []string
	for long := false; ; {
		line, more, err := br.ReadLine()
		if err != nil {
			break
		}
		if !long && !more {
			if v, ok := runner.ParseAddMask(line); ok {
				values = append(values, v)
			}
		}
		long = more
	}
	for _, v := range values {
		_ = m.Add(v) // a value too long to mask is cut from the tail below as far as possible
	}
	// The tail: the last lines of the last few KiB. The first line of the window may be cut,
	// and with it a secret (masked by the line): it is dropped.
	window := int64(4 * MaxLogTailBytes)
	from := max(0, fi.Size()-window)
	buf := make([]byte, fi.Size()-from)
	if _, err := f.ReadAt(buf, from); err != nil && err != io.EOF {
		return ""
	}
	if from > 0 {
		if nl := bytes.IndexByte(buf, '\n'); nl >= 0 {
			buf = buf[nl+1:]
		}
	}
	text := strings.TrimRight(string(m.Mask(buf)), "\n")
	text = strings.ReplaceAll(text, "\r\n", "\n")
	lines := strings.Split(text, "\n")
	lines = lines[max(0, len(lines)-MaxLogTailLines):]
	text = plan.PrintableText(strings.Join(lines, "\n"))
	if len(text) > MaxLogTailBytes {
		text = tailOf(text, MaxLogTailBytes)
		if nl := strings.IndexByte(text, '\n'); nl >= 0 {
			text = text[nl+1:]
		}
	}
	return text
}

// notes are the markdown sections the comment and the summary show after the totals: what the
// plan needs before its apply, the other PRs' claims, and why stacks failed.
func (r *run) notes() []string {
	res := r.res
	var out []string
	if g := res.Gates; g != nil {
		var b strings.Builder
		fmt.Fprintf(&b, "**Gates:** %s", plan.Cell(g.Message))
		if g.Blocked != "" {
			fmt.Fprintf(&b, " This plan cannot be approved as it is: %s.", plan.Cell(strings.TrimSuffix(g.Blocked, ".")))
		}
		b.WriteString("\n")
		for i, gate := range g.Required {
			if i == maxGatesShown {
				fmt.Fprintf(&b, "- … and %d more (see the execution page)\n", len(g.Required)-i)
				break
			}
			fmt.Fprintf(&b, "- %s **%s** on %s, for %s: ", gateMark(gate.Satisfied), plan.Cell(gate.Class), plan.CodeSpan(gate.Target), someNames(gate.Stacks, plan.CodeSpan))
			if gate.Satisfied {
				fmt.Fprintf(&b, "satisfied by grant %d of %s", gate.GrantID, plan.Cell(gate.GrantedBy))
				if !gate.GrantedAt.IsZero() {
					fmt.Fprintf(&b, " at %s", gate.GrantedAt.UTC().Format(time.RFC3339))
				}
				b.WriteString(".\n")
				continue
			}
			b.WriteString("**not satisfied**.")
			if gate.ApproveURL != "" {
				fmt.Fprintf(&b, " An admin approves it on [the execution page](%s)", gate.ApproveURL)
				if gate.Command != "" {
					b.WriteString(" or with:")
				}
			} else if gate.Command != "" {
				b.WriteString(" An admin approves it with:")
			}
			b.WriteString("\n")
			if gate.Command != "" {
				b.WriteString(indentLines(plan.Fence(plan.PrintableText(gate.Command), "sh"), "  "))
			}
		}
		out = append(out, b.String())
	}
	if len(res.Conflicts) > 0 {
		var b strings.Builder
		b.WriteString("> [!WARNING]\n> **Claimed by another pull request:** this plan's apply is denied until these are applied or release their claims.\n")
		for i, c := range res.Conflicts {
			if i == maxConflictsShown {
				fmt.Fprintf(&b, "> - … and %d more pull requests\n", len(res.Conflicts)-i)
				break
			}
			fmt.Fprintf(&b, "> - PR #%d", c.PR)
			if c.Execution != "" {
				fmt.Fprintf(&b, " (plan %s)", plan.CodeSpan(c.Execution))
			}
			fmt.Fprintf(&b, " claims %s\n", someNames(c.Stacks, plan.CodeSpan))
		}
		out = append(out, b.String())
	}
	shown := 0
	for _, e := range res.Stacks {
		if e.Status != StatusFailed && e.Status != StatusCancelled {
			continue
		}
		if shown == maxTailsShown {
			out = append(out, "_More stacks failed; the result document and the execution page have their logs._")
			break
		}
		shown++
		var b strings.Builder
		fmt.Fprintf(&b, "**Why %s %s:** %s\n", plan.CodeSpan(e.Path), stackEnded(e.Status), plan.Cell(e.Error))
		if e.LogTail != "" {
			fmt.Fprintf(&b, "\n<details open><summary>The last lines of its log</summary>\n\n%s\n</details>\n", plan.Fence(e.LogTail, "text"))
		} else {
			b.WriteString("\n_Its log is empty or could not be read._\n")
		}
		out = append(out, b.String())
	}
	if note := r.carriedNote(); note != "" {
		out = append(out, note)
	}
	return out
}

func gateMark(satisfied bool) string {
	if satisfied {
		return "✅"
	}
	return "⛔"
}

// stackEnded says how a stack that did not succeed ended, for "Why stacks/x failed".
func stackEnded(status string) string {
	if status == StatusCancelled {
		return "was cancelled"
	}
	return "failed"
}

// indentLines prefixes every non-empty line of s with prefix.
func indentLines(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "")
}

// annotateNeeds writes the annotations of the run's conflicts and of its failed stacks (with
// the end of their logs).
func (r *run) annotateNeeds(w io.Writer) {
	res := r.res
	for _, c := range res.Conflicts {
		annotate(w, "warning", "tfstackplan "+res.Op+": claimed by PR #"+fmt.Sprint(c.PR),
			fmt.Sprintf("PR #%d claims %s in %s: this plan's apply is denied until PR #%d is applied or releases its claims.",
				c.PR, someNames(c.Stacks, func(s string) string { return s }), res.Environment, c.PR))
	}
	tails := 0
	for _, e := range res.Stacks {
		if e.Status != StatusFailed && e.Status != StatusCancelled {
			continue
		}
		msg := "stack " + e.Path + " " + stackEnded(e.Status) + ": " + e.Error
		if e.LogTail != "" && tails < maxTailsShown {
			tails++
			msg += "\nThe last lines of its log:\n" + e.LogTail
		}
		annotateError(w, "tfstackplan "+res.Op+": "+e.Path, msg)
	}
}

// needsSummary prints, for the terminal, what the plan needs and why stacks failed.
func (r *run) needsSummary(w io.Writer) {
	res := r.res
	if g := res.Gates; g != nil {
		fmt.Fprintf(w, "gates: %s\n", plan.PrintableText(g.Message))
		if g.Blocked != "" {
			fmt.Fprintf(w, "  this plan cannot be approved as it is: %s\n", plan.PrintableText(g.Blocked))
		}
		for _, gate := range g.Required {
			state := "NOT SATISFIED"
			if gate.Satisfied {
				state = fmt.Sprintf("satisfied by grant %d of %s", gate.GrantID, plan.PrintableText(gate.GrantedBy))
			}
			fmt.Fprintf(w, "  %s on %s (%s): %s\n", gate.Class, plan.PrintableText(gate.Target), plan.PrintableText(strings.Join(gate.Stacks, ", ")), state)
			if !gate.Satisfied {
				if gate.ApproveURL != "" {
					fmt.Fprintf(w, "    approve on %s\n", plan.PrintableText(gate.ApproveURL))
				}
				if gate.Command != "" {
					fmt.Fprintf(w, "    or: %s\n", plan.PrintableText(gate.Command))
				}
			}
		}
	}
	for _, c := range res.Conflicts {
		fmt.Fprintf(w, "claimed by PR #%d: %s\n", c.PR, plan.PrintableText(strings.Join(c.Stacks, ", ")))
	}
	for _, e := range res.Stacks {
		if (e.Status == StatusFailed || e.Status == StatusCancelled) && e.LogTail != "" {
			fmt.Fprintf(w, "the last lines of %s's log:\n%s\n", plan.PrintableText(e.Path), indentLines(e.LogTail+"\n", "  | "))
		}
	}
}

// stackError says in a sentence why a stack that did not succeed has no plan.
func stackError(status string) string {
	switch status {
	case StatusFailed:
		return "the script failed"
	case StatusCancelled:
		return "the run was cancelled before the script finished"
	case StatusNotRun:
		return "the script did not run: the run stopped before it got to this stack"
	}
	return "the script ended " + status
}
