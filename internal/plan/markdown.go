package plan

import (
	"fmt"
	"strings"

	"github.com/tfstackplan/tfstackplan/events"
)

// mdLevel is how much detail a markdown render keeps; higher drops more.
type mdLevel int

const (
	mdFull         mdLevel = iota // everything, with attribute-level diffs
	mdNoAttributes                // per-stack detail without attribute diffs
	mdNoDetail                    // no per-stack detail: totals, destructive list, stack table
	mdChangedTable                // stack table only for stacks with changes or errors
	mdNoTable                     // totals, destructive list, errors, link
	mdTrimDestroy                 // as mdNoTable with the destructive list cut to fit
	mdLevels
)

// Markdown renders r as GitHub step-summary markdown, at most MaxSummaryBytes.
func Markdown(r *Report) string { return fitMarkdown(r, MaxSummaryBytes) }

// Comment renders r as PR-comment markdown, at most MaxCommentChars. It drops attribute
// detail first, then per-stack detail; the totals, the destructive list (cut only when it
// alone cannot fit) and the link to the execution page always stay.
func Comment(r *Report) string { return fitMarkdown(r, MaxCommentChars) }

// fitMarkdown renders r at the most detail that fits in limit bytes. Each level is rendered
// against a byte budget and left as soon as what it has written cannot fit: the cost of a
// render is bounded by the limit and the detail of one stack, not by the report (200 stacks at
// the most detail are hundreds of megabytes of markdown at the first level).
func fitMarkdown(r *Report, limit int) string {
	sec := r.secrets()
	v := newRedactedView(r, sec)
	for level := mdFull; level < mdTrimDestroy; level++ {
		if out, ok := fitLevel(v, level, -1, limit); ok {
			return out
		}
	}
	// Keep as many destructive entries as fit: binary search on the count.
	hi, _ := destructiveCount(r)
	lo := 0
	best, _ := fitLevel(v, mdTrimDestroy, 0, limit)
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if out, ok := fitLevel(v, mdTrimDestroy, mid, limit); ok {
			best, lo = out, mid
		} else {
			hi = mid - 1
		}
	}
	return cutToFit(r, best, limit)
}

// cutToFit is the smallest render of r, best, cut to limit bytes when it is longer: only
// pathological stack names or errors get there. It is cut on a line boundary, keeping the link
// to the execution page after the cut. best holds at least the first limit bytes of the render.
func cutToFit(r *Report, best string, limit int) string {
	if len(best) <= limit {
		return best
	}
	link := executionLink(r)
	if len(link)+len(cutNote) > limit {
		link = ""
	}
	keep := max(0, limit-len(cutNote)-len(link))
	return best[:strings.LastIndexByte(best[:keep], '\n')+1] + cutNote + link
}

// fitLevel renders the markdown of v at level (see markdown) and reports whether it fits in
// limit bytes. When it does not, the text returned is the beginning of the render, of more
// than limit bytes.
func fitLevel(v *redactedView, level mdLevel, keepDestructive, limit int) (string, bool) {
	out, whole := markdown(v, level, keepDestructive, limit)
	return out, whole && len(out) <= limit
}

const cutNote = "\n_… cut to fit the size limit._\n"

// maxCollapsedWarnings is how many unclassified stacks the smallest markdown levels name; the
// rest are counted.
const maxCollapsedWarnings = 10

// executionLink is the markdown link to the execution page, "" when there is none.
func executionLink(r *Report) string {
	if r.ExecutionURL == "" {
		return ""
	}
	return fmt.Sprintf("[Execution details and logs](%s)\n", r.ExecutionURL)
}

// markdown renders v's report at level; keepDestructive < 0 keeps the whole destructive list.
// Once the text is longer than budget it stops after the entry (a destructive change, a
// warning, a table row, a stack's detail) that made it so: whole is then false, and the text
// is the beginning of the whole render. Stacks are redacted as the render reaches them.
func markdown(v *redactedView, level mdLevel, keepDestructive, budget int) (text string, whole bool) {
	r := v.r
	var b strings.Builder
	over := func() bool { return b.Len() > budget }
	b.WriteString(mdHeading(r))
	fmt.Fprintf(&b, "**Totals:** %s\n\n", totalsLine(r, " · "))
	b.WriteString(mdNotes(r, v.sec))

	listed, omitted := destructiveCount(r)
	if listed > 0 || omitted > 0 {
		fmt.Fprintf(&b, "> [!CAUTION]\n> **%s** — these delete, replace or forget existing resources:\n>\n",
			plural(listed+omitted, "destructive change", "destructive changes"))
		keep := listed
		if keepDestructive >= 0 && keepDestructive < listed {
			omitted += listed - keepDestructive
			keep = keepDestructive
		}
		n, prev := 0, ""
		for i := range r.Stacks {
			if n == keep {
				break
			}
			s := v.stack(i, viewDestructive)
			shown, _ := s.shownDestructive()
			for _, c := range shown[:min(len(shown), keep-n)] {
				switch {
				case level < mdNoTable:
					fmt.Fprintf(&b, "> - %s: %s\n", code(s.Name), mdChange(c))
				case n == 0:
					fmt.Fprintf(&b, "> - %s: ", code(s.Name))
				case s.Name != prev:
					fmt.Fprintf(&b, "\n> - %s: ", code(s.Name))
				default:
					b.WriteString(", ")
				}
				if level >= mdNoTable {
					// One line per stack, addresses only.
					fmt.Fprintf(&b, "%s %s", c.Action.Symbol(), code(c.Address))
					if c.Deposed != "" {
						fmt.Fprintf(&b, " (deposed object %s)", cell(c.Deposed))
					}
				}
				n, prev = n+1, s.Name
				if over() {
					return b.String(), false
				}
			}
		}
		if level >= mdNoTable && n > 0 {
			b.WriteString("\n")
		}
		if omitted > 0 {
			fmt.Fprintf(&b, "> - … and %d more (see the execution page)\n", omitted)
		}
		b.WriteString("\n")
	}
	var unc []int
	for i, s := range r.Stacks {
		if s.Class == events.ClassUnclassified {
			unc = append(unc, i)
		}
	}
	shown := unc
	if level >= mdNoTable && len(unc) > maxCollapsedWarnings {
		shown = unc[:maxCollapsedWarnings]
	}
	for _, i := range shown {
		s := v.stack(i, viewHead)
		fmt.Fprintf(&b, "> [!WARNING]\n> %s could not be classified (treated as unclassified): %s\n\n", code(s.Name), cell(s.Error))
		if over() {
			return b.String(), false
		}
	}
	for i := range r.Stacks {
		if !r.Stacks[i].Partial && len(r.Stacks[i].Checks) == 0 {
			continue
		}
		s := v.stack(i, viewHead)
		b.WriteString("> [!WARNING]\n")
		for _, w := range stackWarnings(s) {
			fmt.Fprintf(&b, "> %s: %s\n", code(s.Name), cell(w))
		}
		b.WriteString("\n")
		if over() {
			return b.String(), false
		}
	}
	if n := len(unc) - len(shown); n > 0 {
		fmt.Fprintf(&b, "> [!WARNING]\n> … and %s could not be classified (treated as unclassified)", plural(n, "more stack", "more stacks"))
		if r.ExecutionURL != "" {
			b.WriteString("; see the execution page")
		}
		b.WriteString(".\n\n")
	}

	if level <= mdChangedTable && len(r.Stacks) > 0 {
		// The move column only when some stack moves something.
		moves := r.Totals().Move > 0
		moveHead, moveAlign := "", ""
		if moves {
			moveHead, moveAlign = " →move |", "--:|"
		}
		b.WriteString("| Stack | Class | +create | ~update | ±replace | -delete | forget | import | read |" + moveHead + " outputs | why |\n")
		b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|" + moveAlign + "--:|---|\n")
		hidden := 0
		for i, s := range r.Stacks {
			if level == mdChangedTable && s.Counts.Total() == 0 && s.OutputsChanged == 0 && s.Error == "" {
				hidden++
				continue
			}
			s = v.stack(i, viewHead)
			c := s.Counts
			move := ""
			if moves {
				move = fmt.Sprintf(" %d |", c.Move)
			}
			fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %d | %d |%s %d | %s |\n",
				cellCode(s.Name), classBadge(s.Class), c.Create, c.Update, c.Replace, c.Delete, c.Forget, c.Import, c.Read, move,
				s.OutputsChanged, cell(strings.Join(s.Why, "; ")))
			if over() {
				return b.String(), false
			}
		}
		if hidden > 0 {
			fmt.Fprintf(&b, "\n_%s without changes not listed._\n", plural(hidden, "stack", "stacks"))
		}
		b.WriteString("\n")
	}

	if level <= mdNoAttributes {
		for i := range r.Stacks {
			s := v.stack(i, viewDetail)
			lines := detailLines(s, level == mdFull, r.ExecutionURL)
			if len(lines) == 0 {
				continue
			}
			fmt.Fprintf(&b, "<details><summary>%s: %s (%s)</summary>\n\n", htmlCode(s.Name), s.Class, shortCounts(s.Counts))
			for i := range lines {
				lines[i] = Printable(lines[i])
			}
			b.WriteString(fence(strings.Join(lines, "\n"), "diff"))
			b.WriteString("\n</details>\n\n")
			if over() {
				return b.String(), false
			}
		}
	} else if level <= mdNoTable {
		b.WriteString("_Per-stack detail left out to fit the size limit")
		if r.ExecutionURL != "" {
			b.WriteString("; it is on the execution page")
		}
		b.WriteString("._\n\n")
	}

	b.WriteString(executionLink(r))
	return b.String(), true
}

// destructiveCount is how many destructive changes the markdown of r lists, and how many more
// it counts (see shownDestructive).
func destructiveCount(r *Report) (listed, omitted int) {
	for _, s := range r.Stacks {
		shown, more := s.shownDestructive()
		listed += len(shown)
		omitted += more
	}
	return listed, omitted
}

func mdChange(c Change) string {
	return fmt.Sprintf("%s %s (%s)", c.Action.Symbol(), code(c.Address), cell(actionDetail(c)))
}

// code is s as a markdown code span, whatever backticks it holds. Outside a table a `|` needs
// no escape (and a backslash inside a code span would show): cellCode is for table cells.
func code(s string) string {
	// A lone CR ends a markdown line too: without it no address can start a block.
	s = Printable(lineBreaks.Replace(s))
	ticks := strings.Repeat("`", longestRun(s, '`')+1)
	pad := ""
	if strings.HasPrefix(s, "`") || strings.HasSuffix(s, "`") {
		pad = " "
	}
	return ticks + pad + s + pad + ticks
}

// cellCode is code(s) for a table cell, where GitHub splits the row on every unescaped `|`,
// even inside a code span, and shows `\|` there as `|`.
func cellCode(s string) string { return strings.ReplaceAll(code(s), "|", "\\|") }

// htmlCode is s as an HTML code element (markdown is not parsed inside <summary>).
func htmlCode(s string) string {
	return "<code>" + Printable(htmlEscaper.Replace(lineBreaks.Replace(s))) + "</code>"
}

var (
	lineBreaks  = strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ")
	htmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", "\n", " ")
	cellEscaper = strings.NewReplacer("|", "\\|", "\n", " ", "\r", " ", "<", "&lt;", ">", "&gt;")
)

// cell makes s safe inside a table cell or a single markdown line.
func cell(s string) string {
	return Printable(cellEscaper.Replace(s))
}

// fence is content in a fenced code block longer than any backtick run inside it.
func fence(content, lang string) string {
	ticks := strings.Repeat("`", max(3, longestRun(content, '`')+1))
	return ticks + lang + "\n" + content + "\n" + ticks + "\n"
}

func longestRun(s string, c byte) int {
	best, run := 0, 0
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			run++
			best = max(best, run)
		} else {
			run = 0
		}
	}
	return best
}
