package plan

import (
	"fmt"
	"strings"
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

func fitMarkdown(r *Report, limit int) string {
	sec := r.secrets()
	r = r.redacted(sec)
	for level := mdFull; level < mdTrimDestroy; level++ {
		if out := sec.scrub(markdown(r, level, -1)); len(out) <= limit {
			return out
		}
	}
	// Keep as many destructive entries as fit: binary search on the count.
	list, _ := destructiveList(r)
	lo, hi := 0, len(list)
	best := sec.scrub(markdown(r, mdTrimDestroy, 0))
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if out := sec.scrub(markdown(r, mdTrimDestroy, mid)); len(out) <= limit {
			best, lo = out, mid
		} else {
			hi = mid - 1
		}
	}
	if len(best) > limit {
		// Only pathological stack names or errors get here; cut on a line boundary, and keep
		// the link to the execution page after the cut.
		link := sec.scrub(executionLink(r))
		if len(link)+len(cutNote) > limit {
			link = ""
		}
		keep := max(0, limit-len(cutNote)-len(link))
		best = best[:strings.LastIndexByte(best[:keep], '\n')+1] + cutNote + link
	}
	return best
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

// markdown renders r at level; keepDestructive < 0 keeps the whole destructive list.
func markdown(r *Report, level mdLevel, keepDestructive int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "### tfstackplan: %s\n\n", classBadge(r.Class()))
	fmt.Fprintf(&b, "**Totals:** %s\n\n", totalsLine(r, " · "))
	if g := gateNames(r); g != "" {
		fmt.Fprintf(&b, "**Gate needed for:** %s\n\n", g)
	}

	list, omitted := destructiveList(r)
	if len(list) > 0 || omitted > 0 {
		fmt.Fprintf(&b, "> [!CAUTION]\n> **%s** — these delete, replace or forget existing resources:\n>\n",
			plural(len(list)+omitted, "destructive change", "destructive changes"))
		if keepDestructive >= 0 && keepDestructive < len(list) {
			omitted += len(list) - keepDestructive
			list = list[:keepDestructive]
		}
		if level < mdNoTable {
			for _, e := range list {
				fmt.Fprintf(&b, "> - %s: %s\n", code(e.stack), mdChange(e.change))
			}
		} else {
			compactDestructive(&b, list)
		}
		if omitted > 0 {
			fmt.Fprintf(&b, "> - … and %d more (see the execution page)\n", omitted)
		}
		b.WriteString("\n")
	}
	unc := unclassified(r)
	shown := unc
	if level >= mdNoTable && len(unc) > maxCollapsedWarnings {
		shown = unc[:maxCollapsedWarnings]
	}
	for _, s := range shown {
		fmt.Fprintf(&b, "> [!WARNING]\n> %s could not be classified (treated as unclassified): %s\n\n", code(s.Name), cell(s.Error))
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
		for _, s := range r.Stacks {
			if level == mdChangedTable && s.Counts.Total() == 0 && s.OutputsChanged == 0 && s.Error == "" {
				hidden++
				continue
			}
			c := s.Counts
			move := ""
			if moves {
				move = fmt.Sprintf(" %d |", c.Move)
			}
			fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %d | %d |%s %d | %s |\n",
				code(s.Name), classBadge(s.Class), c.Create, c.Update, c.Replace, c.Delete, c.Forget, c.Import, c.Read, move,
				s.OutputsChanged, cell(strings.Join(s.Why, "; ")))
		}
		if hidden > 0 {
			fmt.Fprintf(&b, "\n_%s without changes not listed._\n", plural(hidden, "stack", "stacks"))
		}
		b.WriteString("\n")
	}

	if level <= mdNoAttributes {
		for _, s := range r.Stacks {
			lines := detailLines(s, level == mdFull)
			if len(lines) == 0 {
				continue
			}
			fmt.Fprintf(&b, "<details><summary>%s: %s (%s)</summary>\n\n", htmlCode(s.Name), s.Class, shortCounts(s.Counts))
			for i := range lines {
				lines[i] = Printable(lines[i])
			}
			b.WriteString(fence(strings.Join(lines, "\n"), "diff"))
			b.WriteString("\n</details>\n\n")
		}
	} else if level <= mdNoTable {
		b.WriteString("_Per-stack detail left out to fit the size limit")
		if r.ExecutionURL != "" {
			b.WriteString("; it is on the execution page")
		}
		b.WriteString("._\n\n")
	}

	b.WriteString(executionLink(r))
	return b.String()
}

// compactDestructive writes the destructive list one line per stack, addresses only.
func compactDestructive(b *strings.Builder, list []destructiveEntry) {
	for i, e := range list {
		switch {
		case i == 0:
			fmt.Fprintf(b, "> - %s: ", code(e.stack))
		case e.stack != list[i-1].stack:
			fmt.Fprintf(b, "\n> - %s: ", code(e.stack))
		default:
			b.WriteString(", ")
		}
		fmt.Fprintf(b, "%s %s", e.change.Action.Symbol(), code(e.change.Address))
	}
	if len(list) > 0 {
		b.WriteString("\n")
	}
}

func mdChange(c Change) string {
	return fmt.Sprintf("%s %s (%s)", c.Action.Symbol(), code(c.Address), cell(actionDetail(c)))
}

// code is s as a markdown code span, whatever backticks it holds.
func code(s string) string {
	// A lone CR ends a markdown line too: without it no address can start a block.
	s = Printable(lineBreaks.Replace(s))
	ticks := strings.Repeat("`", longestRun(s, '`')+1)
	pad := ""
	if strings.HasPrefix(s, "`") || strings.HasSuffix(s, "`") {
		pad = " "
	}
	return ticks + pad + strings.ReplaceAll(s, "|", "\\|") + pad + ticks
}

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
