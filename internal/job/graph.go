package job

import (
	"path"

	"github.com/tfstackplan/tfstackplan/events"
)

// graph is the order the run's stacks run in: the run graph's edges, and nesting (terramate
// runs a stack before the stacks below it, the nearest enclosing one first). It answers one
// question for the fan-out's cut, a shard's skips and --rerun-failed: which stacks run right
// before and right after a stack.
type graph struct {
	next map[string][]string // stack → the stacks that run right after it
	prev map[string][]string // stack → the stacks it runs right after
}

// newGraph builds the graph of stacks (repository paths) from edges (From runs before To, as
// repository paths); an edge that touches a stack not in stacks is left out.
func newGraph(stacks []string, edges []events.Edge) graph {
	g := graph{next: map[string][]string{}, prev: map[string][]string{}}
	in := make(map[string]bool, len(stacks))
	for _, s := range stacks {
		in[s] = true
	}
	link := func(before, after string) {
		g.next[before] = append(g.next[before], after)
		g.prev[after] = append(g.prev[after], before)
	}
	for _, e := range edges {
		if in[e.From] && in[e.To] {
			link(e.From, e.To)
		}
	}
	for _, s := range stacks {
		for d := path.Dir(s); d != "." && d != "/"; d = path.Dir(d) {
			if in[d] {
				link(d, s)
				break // d runs after the stack it is nested in, in its turn
			}
		}
	}
	return g
}

// withAfter returns the stacks of from and every stack that runs after one of them, directly
// or not.
func (g graph) withAfter(from map[string]bool) map[string]bool {
	out := make(map[string]bool, len(from))
	queue := make([]string, 0, len(from))
	for s, ok := range from {
		if ok {
			out[s] = true
			queue = append(queue, s)
		}
	}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		for _, n := range g.next[s] {
			if !out[n] {
				out[n] = true
				queue = append(queue, n)
			}
		}
	}
	return out
}
