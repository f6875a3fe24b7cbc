package web

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
)

// relaxedDepths is the longest-path depth of each stack of an acyclic execution by repeated
// relaxation over every edge (quadratic; the oracle layers is held to).
func relaxedDepths(x *api.Execution) map[string]int {
	depth := map[string]int{}
	for _, s := range x.Stacks {
		depth[s.Stack] = 0
	}
	for range x.Stacks {
		for _, e := range x.Edges {
			df, okF := depth[e.From]
			dt, okT := depth[e.To]
			if okF && okT && dt < df+1 {
				depth[e.To] = df + 1
			}
		}
	}
	return depth
}

// columns returns the column of each stack in ls.
func columns(ls [][]api.StackState) map[string]int {
	col := map[string]int{}
	for d, l := range ls {
		for _, s := range l {
			col[s.Stack] = d
		}
	}
	return col
}

func execution(n int, edges [][2]int) *api.Execution {
	x := &api.Execution{}
	for i := range n {
		x.Stacks = append(x.Stacks, api.StackState{Stack: fmt.Sprint("s", i)})
	}
	for _, e := range edges {
		x.Edges = append(x.Edges, api.Edge{From: fmt.Sprint("s", e[0]), To: fmt.Sprint("s", e[1])})
	}
	return x
}

// On random acyclic graphs (duplicate edges and edges to unknown stacks included) every stack
// is in the column of its longest chain, and each column is sorted.
func TestLayersAreLongestPathDepths(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for run := 0; run < 500; run++ {
		n := 1 + r.IntN(30)
		var edges [][2]int
		for range r.IntN(3 * n) {
			a, b := r.IntN(n), r.IntN(n)
			if a == b {
				continue
			}
			edges = append(edges, [2]int{min(a, b), max(a, b)}) // low to high: acyclic
		}
		x := execution(n, edges)
		x.Edges = append(x.Edges, api.Edge{From: "s0", To: "elsewhere"}, api.Edge{From: "nowhere", To: "s0"})
		ls := layers(x)
		want := relaxedDepths(x)
		got := columns(ls)
		if len(got) != n {
			t.Fatalf("run %d: %d stacks placed, want %d", run, len(got), n)
		}
		for s, d := range want {
			if got[s] != d {
				t.Fatalf("run %d edges %v: %s in column %d, want %d", run, edges, s, got[s], d)
			}
		}
		for d, l := range ls {
			if len(l) == 0 || !slices.IsSortedFunc(l, func(a, b api.StackState) int { return compare(a.Stack, b.Stack) }) {
				t.Fatalf("run %d: column %d empty or unsorted: %v", run, d, l)
			}
		}
	}
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Stacks on a cycle or after one share one column after the others.
func TestLayersPutCyclesLast(t *testing.T) {
	// s0 -> s1 -> s2 -> s3 -> s1 (a cycle), s3 -> s4, s0 -> s5, s6 alone, s7 -> s7.
	x := execution(8, [][2]int{{0, 1}, {1, 2}, {2, 3}, {3, 1}, {3, 4}, {0, 5}, {7, 7}})
	got := columns(layers(x))
	want := map[string]int{"s0": 0, "s6": 0, "s5": 1, "s1": 2, "s2": 2, "s3": 2, "s4": 2, "s7": 2}
	for s, d := range want {
		if got[s] != d {
			t.Fatalf("columns %v, want %v", got, want)
		}
	}
	if got := columns(layers(execution(3, [][2]int{{0, 1}, {1, 2}, {2, 0}}))); got["s0"] != 0 || got["s1"] != 0 || got["s2"] != 0 {
		t.Fatalf("an execution that is one cycle: %v, want one column", got)
	}
}

// BenchmarkLayers: an execution of n stacks in one chain whose edges are listed last first,
// the order that made the relaxation it replaced take n rounds (8,000 stacks: 9.3 s).
func BenchmarkLayers(b *testing.B) {
	for _, n := range []int{2000, 8000} {
		var edges [][2]int
		for i := n - 1; i > 0; i-- {
			edges = append(edges, [2]int{i - 1, i})
		}
		x := execution(n, edges)
		b.Run(fmt.Sprint("chain=", n), func(b *testing.B) {
			for b.Loop() {
				layers(x)
			}
		})
	}
}
