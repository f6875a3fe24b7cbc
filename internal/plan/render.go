package plan

import (
	"fmt"
	"strings"

	"github.com/tfstackplan/tfstackplan/events"
)

// Size bounds of the renders.
const (
	// MaxSummaryBytes bounds the GitHub step summary (GitHub rejects a larger one).
	MaxSummaryBytes = 1 << 20
	// MaxCommentChars bounds a PR comment (GitHub's limit is 65,536 characters; the bound is
	// applied to bytes, which is stricter).
	MaxCommentChars = 65536
)

// classBadge is a class with a colour-coded marker for markdown.
func classBadge(c events.Class) string {
	switch c {
	case events.ClassNoChanges:
		return "⚪ no-changes"
	case events.ClassAdditive:
		return "🟢 additive"
	case events.ClassMutating:
		return "🟡 mutating"
	case events.ClassDestructive:
		return "🔴 destructive"
	}
	return "⛔ " + string(events.ClassUnclassified)
}

// countsLine is "+1 create · ~2 update · ..." with every action, joined by sep; moves only
// when there are any.
func countsLine(c Counts, sep string) string {
	parts := []string{
		fmt.Sprintf("+%d create", c.Create),
		fmt.Sprintf("~%d update", c.Update),
		fmt.Sprintf("±%d replace", c.Replace),
		fmt.Sprintf("-%d delete", c.Delete),
		fmt.Sprintf("%d forget", c.Forget),
		fmt.Sprintf("%d import", c.Import),
		fmt.Sprintf("%d read", c.Read),
	}
	if c.Move > 0 {
		parts = append(parts, fmt.Sprintf("→%d move", c.Move))
	}
	return strings.Join(parts, sep)
}

// shortCounts is "+1 ~2 ±0 -1" plus the rarer actions when present.
func shortCounts(c Counts) string {
	s := fmt.Sprintf("+%d ~%d ±%d -%d", c.Create, c.Update, c.Replace, c.Delete)
	for _, x := range []struct {
		n    int
		name string
	}{{c.Forget, "forget"}, {c.Import, "import"}, {c.Read, "read"}, {c.Move, "move"}} {
		if x.n > 0 {
			s += fmt.Sprintf(" %d %s", x.n, x.name)
		}
	}
	return s
}

func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

// totalsLine is the report's totals: stacks, counts, outputs and drift.
func totalsLine(r *Report, sep string) string {
	return strings.Join([]string{
		plural(len(r.Stacks), "stack", "stacks"),
		countsLine(r.Totals(), sep),
		plural(r.OutputsChanged(), "output changed", "outputs changed"),
		plural(r.DriftCount(), "drifted resource", "drifted resources"),
	}, sep)
}

// Head is the change's one-line head as the renders print it: "± aws_x.y (replace,
// delete-then-create: replace_because_cannot_update)", the address made printable.
func (c Change) Head() string {
	return fmt.Sprintf("%s %s (%s)", c.Action.Symbol(), Printable(c.Address), actionDetail(c))
}

// Printable replaces every control character (C0, DEL and C1) of s with '?', so that text from
// a plan, a stack path or a tool's output cannot drive a terminal.
func Printable(s string) string { return printableKeeping(s, "") }

// PrintableText is Printable keeping newlines and tabs (multi-line messages).
func PrintableText(s string) string { return printableKeeping(s, "\n\t") }

func printableKeeping(s, keep string) string {
	return strings.Map(func(r rune) rune {
		if (r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0)) && !strings.ContainsRune(keep, r) {
			return '?'
		}
		return r
	}, s)
}

// actionDetail is "replace, delete-then-create: replace_because_cannot_update", "move from
// x.old" for a move, "update, moved from x.old" for a moved object that also changes,
// "deposed object 1a2b3c4d, delete" for a deposed object.
func actionDetail(c Change) string {
	detail := string(c.Action)
	if c.Outside {
		switch c.Action {
		case ActionForget:
			detail = "forget: deleted outside, the apply drops it from the state"
		case ActionDelete:
			detail = "deleted outside"
		case ActionUpdate:
			detail = "changed outside"
		default:
			detail += " outside"
		}
	}
	if c.Deposed != "" {
		detail = "deposed object " + Printable(c.Deposed) + ", " + detail
	}
	if c.Order != "" {
		detail += ", " + c.Order
	}
	if c.Importing && c.Action != ActionImport {
		detail += ", importing"
	}
	if c.PreviousAddress != "" {
		if c.Action == ActionMove {
			detail += " from " + Printable(c.PreviousAddress)
		} else {
			detail += ", moved from " + Printable(c.PreviousAddress)
		}
	}
	if c.Reason != "" {
		detail += ": " + Printable(c.Reason)
	}
	return detail
}

// attrLines are the indented attribute diffs of a change with action a: a create shows the
// new values, a delete the old ones, anything else old -> new (a list element only one side
// holds as "- path = old" or "+ path = new", a multi-line string as its line diff). A forget or
// a move shows none (nothing changes in the infrastructure). omitted counts the attributes not
// shown, omittedBytes the size of those too large to show; link is where the whole plan is
// shown ("" when unknown).
func attrLines(a Action, diffs []AttrDiff, omitted int, omittedBytes int64, link, indent string) []string {
	if a == ActionForget || a == ActionMove {
		return nil
	}
	var out []string
	for _, d := range diffs {
		switch {
		case a == ActionCreate || a == ActionRead:
			out = append(out, fmt.Sprintf("%s%s = %s", indent, d.Path, d.After))
		case a == ActionDelete:
			out = append(out, fmt.Sprintf("%s%s = %s", indent, d.Path, d.Before))
		case d.Element == "removed":
			out = append(out, fmt.Sprintf("%s- %s = %s", indent, d.Path, d.Before))
		case d.Element == "added":
			out = append(out, fmt.Sprintf("%s+ %s = %s", indent, d.Path, d.After))
		case len(d.Lines) > 0:
			out = append(out, fmt.Sprintf("%s%s: <<-EOT", indent, d.Path))
			for _, l := range d.Lines {
				if l.Op == LineHidden {
					out = append(out, fmt.Sprintf("%s    … %s", indent, l.Text))
				} else {
					out = append(out, fmt.Sprintf("%s  %s %s", indent, l.Op, l.Text))
				}
			}
			out = append(out, indent+"  EOT")
		default:
			out = append(out, fmt.Sprintf("%s%s: %s -> %s", indent, d.Path, d.Before, d.After))
		}
	}
	if omitted > 0 {
		more := "more "
		if len(diffs) == 0 {
			more = ""
		}
		line := fmt.Sprintf("%s… %s not shown", indent, plural(omitted, more+"attribute", more+"attributes"))
		if omittedBytes > 0 {
			line += ": " + byteSize(omittedBytes)
			if link != "" {
				line += " (see " + link + ")"
			}
		}
		out = append(out, line)
	}
	return out
}

// byteSize is n as "512 B", "100.0 KB" or "1.0 MB" (decimal units).
func byteSize(n int64) string {
	switch {
	case n < 1000:
		return fmt.Sprintf("%d B", n)
	case n < 1000*1000:
		return fmt.Sprintf("%.1f KB", float64(n)/1000)
	}
	return fmt.Sprintf("%.1f MB", float64(n)/1000/1000)
}

// detailLines are the per-stack detail lines (changes, outputs, drift) shared by the
// markdown and text renders; attrs includes attribute-level diffs; link is the execution
// page, "" when there is none.
func detailLines(s *Stack, attrs bool, link string) []string {
	var out []string
	for _, c := range s.Changes {
		out = append(out, c.Head())
		if attrs {
			out = append(out, attrLines(c.Action, c.Attributes, c.AttributesOmitted, c.AttributesOmittedBytes, link, "    ")...)
		}
	}
	if s.ChangesOmitted > 0 {
		out = append(out, fmt.Sprintf("… %s not listed", plural(s.ChangesOmitted, "more change", "more changes")))
	}
	if s.OutputsChanged > 0 {
		out = append(section(out), "Outputs:")
		for _, o := range s.Outputs {
			head := fmt.Sprintf("%s output.%s (%s)", o.Action.Symbol(), Printable(o.Name), o.Action)
			if !attrs {
				out = append(out, head)
				continue
			}
			// A scalar output is one line: "~ output.a (update): "one" -> "uno"".
			omitted := 0
			if o.ValueOmittedBytes > 0 {
				omitted = 1
			}
			lines := attrLines(o.Action, o.Attributes, omitted, o.ValueOmittedBytes, link, "    ")
			if len(lines) == 1 && len(o.Attributes) == 1 && o.Attributes[0].Path == o.Name {
				_, value, _ := strings.Cut(lines[0], o.Name)
				out = append(out, head+value)
				continue
			}
			out = append(append(out, head), lines...)
		}
	}
	if s.DriftCount > 0 {
		if s.DriftRecorded > 0 {
			out = append(section(out), fmt.Sprintf("Drift (changed outside tofu/terraform): %d, of which the apply records %d in the state",
				s.DriftCount, s.DriftRecorded))
		} else {
			out = append(section(out), fmt.Sprintf("Drift (changed outside tofu/terraform, not classified): %d", s.DriftCount))
		}
		for _, d := range s.Drift {
			out = append(out, d.Head())
			if attrs {
				out = append(out, attrLines(d.Action, d.Attributes, d.AttributesOmitted, d.AttributesOmittedBytes, link, "    ")...)
			}
		}
	}
	return out
}

// stackWarnings are what a stack's plan warns of besides its changes: that it is partial, and
// each failed check with its (masked) messages, at most maxCollapsedWarnings of them; the
// renders show them in every format.
func stackWarnings(s *Stack) []string {
	var out []string
	if s.Partial {
		out = append(out, fmt.Sprintf("partial plan: %s of the state not planned (-target or -exclude); applying it changes only part of the configuration",
			plural(s.Unplanned, "object", "objects")))
	}
	for i, c := range s.Checks {
		if i == maxCollapsedWarnings {
			out = append(out, fmt.Sprintf("… and %s", plural(len(s.Checks)-i, "more failed check", "more failed checks")))
			break
		}
		line := c.Address + " failed"
		if c.Status == "error" {
			line = c.Address + " could not be evaluated"
		}
		if len(c.Problems) > 0 {
			line += ": " + strings.Join(c.Problems, "; ")
		}
		out = append(out, line)
	}
	return out
}

// partialReport reports whether a stack of r has a partial plan.
func partialReport(r *Report) bool {
	for _, s := range r.Stacks {
		if s.Partial {
			return true
		}
	}
	return false
}

// section separates a new section from lines above it, if any, with a blank line.
func section(lines []string) []string {
	if len(lines) == 0 {
		return lines
	}
	return append(lines, "")
}

// destructiveEntry is one line of the destructive list.
type destructiveEntry struct {
	stack  string
	change Change
}

// shownDestructive is what the text and markdown renders list of s's destructive changes (at
// most MaxDestructive: the JSON render and the execution page have them all), and how many
// more they count.
func (s *Stack) shownDestructive() (shown []Change, more int) {
	n := min(len(s.Destructive), MaxDestructive)
	return s.Destructive[:n], len(s.Destructive) - n + s.DestructiveOmitted
}

func destructiveList(r *Report) (list []destructiveEntry, omitted int) {
	for _, s := range r.Stacks {
		shown, more := s.shownDestructive()
		for _, c := range shown {
			list = append(list, destructiveEntry{s.Name, c})
		}
		omitted += more
	}
	return list, omitted
}

// subject names what r is of for a heading, "" without an environment: "prod (stacks/prod)",
// each part through quote (a code span in markdown).
func subject(r *Report, quote func(string) string) string {
	if r.Environment == "" {
		return ""
	}
	dir := "the repository's root"
	if r.Dir != "" && r.Dir != "." {
		dir = quote(r.Dir)
	}
	return quote(r.Environment) + " in " + dir
}

// mdHeading is the markdown render's first lines: the heading, naming the environment and its
// directory when r has them, and the caller's notes follow the totals.
func mdHeading(r *Report) string {
	head := "### tfstackplan: "
	if s := subject(r, code); s != "" {
		head += s + " — "
	}
	head += classBadge(r.Class())
	if partialReport(r) {
		head += " (partial plan)"
	}
	return head + "\n\n"
}

// mdNotes is the caller's notes, each as its own paragraph, masked as free text with sec.
func mdNotes(r *Report, sec *secretSet) string {
	var b strings.Builder
	for _, n := range r.Notes {
		b.WriteString(strings.TrimRight(sec.redactText(n), "\n"))
		b.WriteString("\n\n")
	}
	return b.String()
}

// CodeSpan is s as a markdown code span, whatever it holds (for a caller's Notes).
func CodeSpan(s string) string { return code(s) }

// Cell is s made safe inside a markdown table cell or a single markdown line.
func Cell(s string) string { return cell(s) }

// Fence is content in a fenced code block of language lang that no line of content can end.
func Fence(content, lang string) string { return fence(content, lang) }
