package job

import (
	"maps"
	"slices"
	"testing"

	"github.com/tfstackplan/tfstackplan/events"
)

// A stack runs after its run-graph predecessors and after the nearest stack it is nested in;
// edges that touch stacks outside the run count for nothing.
func TestGraphEdgesAndNesting(t *testing.T) {
	stacks := []string{"s/a", "s/a/b", "s/a/b/c", "s/d", "s/e"}
	g := newGraph(stacks, []events.Edge{{From: "s/d", To: "s/a"}, {From: "s/x", To: "s/e"}})
	for s, want := range map[string][]string{"s/a": {"s/d"}, "s/a/b": {"s/a"}, "s/a/b/c": {"s/a/b"}, "s/d": nil, "s/e": nil} {
		if got := g.prev[s]; !slices.Equal(got, want) {
			t.Errorf("%s runs after %q, want %q", s, got, want)
		}
	}
	got := slices.Sorted(maps.Keys(g.withAfter(map[string]bool{"s/d": true})))
	if want := []string{"s/a", "s/a/b", "s/a/b/c", "s/d"}; !slices.Equal(got, want) {
		t.Errorf("s/d and what runs after it: %q, want %q", got, want)
	}
	if got := g.withAfter(map[string]bool{"s/e": true}); len(got) != 1 {
		t.Errorf("s/e and what runs after it: %v, want s/e alone", got)
	}
}
