package web

import (
	"fmt"
	"html/template"
	"strings"

	"unicode/utf8"

	"github.com/tfstackplan/tfstackplan/internal/api"
)

// The stack graph is drawn on the server as SVG, so that it reads with no script: one box per
// stack in the columns layers gives, and an arrow per dependency. Past maxGraphNodes stacks it
// is summarized: one box per band of columns, with how many stacks of each status it holds, and
// one arrow per pair of bands with dependencies between them, labelled with their number.

// maxGraphNodes is the most stacks the graph draws one by one.
const maxGraphNodes = 150

// maxGraphBands is the most boxes the summarized graph draws.
const maxGraphBands = 12

// Layout of the drawing, in SVG user units (pixels at 100%).
const (
	colWidth   = 200
	nodeWidth  = 170
	nodeHeight = 38
	rowHeight  = 48
	bandHeight = 150
	margin     = 6
	nodeChars  = 24
)

// stackGraph draws the execution's stacks in their columns (ls, as layers returns them).
func stackGraph(x *api.Execution, ls [][]api.StackState) template.HTML {
	if len(x.Stacks) == 0 {
		return ""
	}
	if len(x.Stacks) > maxGraphNodes {
		return summaryGraph(x, ls)
	}
	type place struct{ col, row int }
	at := make(map[string]place, len(x.Stacks))
	rows := 0
	for c, l := range ls {
		for r, s := range l {
			at[s.Stack] = place{c, r}
		}
		rows = max(rows, len(l))
	}
	var b strings.Builder
	open(&b, len(ls)*colWidth, rows*rowHeight, fmt.Sprintf("Stack graph: %d stacks, %d dependencies", len(x.Stacks), len(x.Edges)))
	for _, e := range x.Edges {
		f, okF := at[e.From]
		t, okT := at[e.To]
		if !okF || !okT {
			continue
		}
		x1, y1 := f.col*colWidth+margin+nodeWidth, f.row*rowHeight+margin+nodeHeight/2
		x2, y2 := t.col*colWidth+margin, t.row*rowHeight+margin+nodeHeight/2
		fmt.Fprintf(&b, `<path class="edge" d="M%d %d C%d %d %d %d %d %d"><title>%s → %s</title></path>`,
			x1, y1, (x1+x2)/2, y1, (x1+x2)/2, y2, x2-2, y2, esc(e.From), esc(e.To))
	}
	for c, l := range ls {
		for r, s := range l {
			x0, y0 := c*colWidth+margin, r*rowHeight+margin
			name := s.Stack
			if len(name) > nodeChars {
				name = "…" + suffix(name, nodeChars-1)
			}
			what := string(s.Status)
			if s.Class != "" {
				what += " · " + string(s.Class)
			}
			fmt.Fprintf(&b, `<g class="node %s"><title>%s: %s</title><rect x="%d" y="%d" width="%d" height="%d" rx="5"/>`+
				`<text x="%d" y="%d">%s</text><text class="sub" x="%d" y="%d">%s</text></g>`,
				esc(string(s.Status)), esc(s.Stack), esc(what), x0, y0, nodeWidth, nodeHeight,
				x0+8, y0+15, esc(name), x0+8, y0+31, esc(what))
		}
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// summaryGraph draws the columns of a large execution in at most maxGraphBands bands.
func summaryGraph(x *api.Execution, ls [][]api.StackState) template.HTML {
	bands := min(len(ls), maxGraphBands)
	bandOf := func(col int) int { return col * bands / len(ls) }
	type tally struct {
		stacks   int
		status   map[api.StackStatus]int
		from, to int // first and last column
	}
	ts := make([]tally, bands)
	band := make(map[string]int, len(x.Stacks))
	for c, l := range ls {
		t := &ts[bandOf(c)]
		if t.status == nil {
			t.status, t.from = map[api.StackStatus]int{}, c
		}
		t.to = c
		for _, s := range l {
			band[s.Stack] = bandOf(c)
			t.stacks++
			t.status[s.Status]++
		}
	}
	links := map[[2]int]int{}
	within := 0
	for _, e := range x.Edges {
		f, okF := band[e.From]
		t, okT := band[e.To]
		switch {
		case !okF || !okT:
		case f == t:
			within++
		default:
			links[[2]int{f, t}]++
		}
	}
	var b strings.Builder
	open(&b, bands*colWidth, bandHeight+2*margin+20, fmt.Sprintf("Stack graph, summarized: %d stacks in %d columns, %d dependencies", len(x.Stacks), len(ls), len(x.Edges)))
	y := margin + bandHeight/2
	for k := range bands {
		for j := k + 1; j < bands; j++ {
			n := links[[2]int{k, j}]
			if n == 0 {
				continue
			}
			x1, x2 := k*colWidth+margin+nodeWidth, j*colWidth+margin
			// Arrows that skip bands arc below the boxes, so they do not cross them.
			dip := bandHeight/2 + 12*(j-k-1)
			if j == k+1 {
				dip = 0
			}
			fmt.Fprintf(&b, `<path class="edge" d="M%d %d C%d %d %d %d %d %d"><title>%d dependencies</title></path>`,
				x1, y, x1+40, y+dip, x2-40, y+dip, x2-2, y, n)
			fmt.Fprintf(&b, `<text class="sub" x="%d" y="%d">%d</text>`, (x1+x2)/2-8, y+dip*3/4-4, n)
		}
	}
	for k, t := range ts {
		x0 := k*colWidth + margin
		cols := fmt.Sprintf("column %d", t.from+1)
		if t.to > t.from {
			cols = fmt.Sprintf("columns %d–%d", t.from+1, t.to+1)
		}
		n := fmt.Sprintf("%d stacks", t.stacks)
		if t.stacks == 1 {
			n = "1 stack"
		}
		fmt.Fprintf(&b, `<g class="node band"><title>%s: %s</title><rect x="%d" y="%d" width="%d" height="%d" rx="5"/>`+
			`<text x="%d" y="%d">%s</text><text x="%d" y="%d">%s</text>`,
			cols, n, x0, margin, nodeWidth, bandHeight, x0+8, margin+16, cols, x0+8, margin+34, n)
		line := 0
		for _, st := range statusOrder {
			if n := t.status[st]; n > 0 && line < 5 {
				fmt.Fprintf(&b, `<text class="sub %s" x="%d" y="%d">%d %s</text>`, st, x0+8, margin+56+line*18, n, st)
				line++
			}
		}
		b.WriteString(`</g>`)
	}
	if within > 0 {
		fmt.Fprintf(&b, `<text class="sub" x="%d" y="%d">%d more dependencies within a box</text>`, margin, bandHeight+2*margin+14, within)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// open starts an SVG drawing of width by height, labelled label.
func open(b *strings.Builder, width, height int, label string) {
	fmt.Fprintf(b, `<svg class="graph" role="img" aria-label="%s" width="%d" height="%d" viewBox="0 0 %d %d" xmlns="http://www.w3.org/2000/svg">`+
		`<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" orient="auto-start-reverse">`+
		`<path d="M0 0L8 4L0 8z" class="head"/></marker></defs>`, esc(label), width, height, width, height)
}

func esc(s string) string { return template.HTMLEscapeString(s) }

// suffix returns the longest suffix of s of at most n bytes that does not start inside a
// character: a stack's last path elements tell it from its neighbours.
func suffix(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := len(s) - n
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return s[i:]
}
