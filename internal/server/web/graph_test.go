package web

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
)

// A small graph draws every stack and an arrow per dependency between known stacks; stack
// names are data, escaped.
func TestStackGraphDrawsEveryEdge(t *testing.T) {
	x := execution(4, [][2]int{{0, 1}, {0, 2}, {1, 3}, {2, 3}})
	x.Stacks[3].Stack = `<script>alert(1)</script>`
	x.Edges[2].To, x.Edges[3].To = x.Stacks[3].Stack, x.Stacks[3].Stack
	x.Edges = append(x.Edges, api.Edge{From: "s0", To: "unknown"})
	g := string(stackGraph(x, layers(x)))
	if n := strings.Count(g, `<path class="edge"`); n != 4 {
		t.Errorf("%d arrows, want 4: %s", n, g)
	}
	if n := strings.Count(g, `<g class="node`); n != 4 {
		t.Errorf("%d boxes, want 4", n)
	}
	if strings.Contains(g, "<script>") || !strings.Contains(g, "&lt;script&gt;") {
		t.Errorf("a stack's name is not escaped: %s", g)
	}
	if stackGraph(&api.Execution{}, nil) != "" {
		t.Error("an execution without stacks has a graph")
	}
}

// Past maxGraphNodes stacks the graph is summarized: at most maxGraphBands boxes counting every
// stack, and arrows between bands counting every dependency that crosses them.
func TestStackGraphSummarizesLargeExecutions(t *testing.T) {
	const n = 10_000
	var edges [][2]int
	for i := 1; i < n; i++ {
		edges = append(edges, [2]int{i / 2, i})
	}
	x := execution(n, edges)
	g := string(stackGraph(x, layers(x)))
	if boxes := strings.Count(g, `<g class="node band">`); boxes < 2 || boxes > maxGraphBands {
		t.Fatalf("%d boxes", boxes)
	}
	total := 0
	for _, m := range regexp.MustCompile(`<title>columns? [0-9–]+: ([0-9]+) stacks?</title>`).FindAllStringSubmatch(g, -1) {
		k, _ := strconv.Atoi(m[1])
		total += k
	}
	if total != n {
		t.Errorf("the boxes count %d stacks, want %d", total, n)
	}
	if len(g) > 20_000 {
		t.Errorf("the summarized graph is %d bytes", len(g))
	}
}
