package runner

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/events"
)

func TestNormalizeEdges(t *testing.T) {
	t.Parallel()
	e := func(from, to string) events.Edge { return events.Edge{From: from, To: to} }
	tests := []struct {
		name   string
		stacks []string
		edges  []events.Edge
		want   []events.Edge
	}{
		{"nil in, empty out", nil, nil, []events.Edge{}},
		{"root listing, leading slash",
			[]string{"stacks/a", "stacks/b"},
			[]events.Edge{e("/stacks/a", "/stacks/b")},
			[]events.Edge{e("stacks/a", "stacks/b")}},
		{"tier listing, suffix match",
			[]string{"cluster/a", "cluster/b", "network"},
			[]events.Edge{e("/stacks/nonprod/network", "/stacks/nonprod/cluster/a"), e("/stacks/nonprod/cluster/a", "/stacks/nonprod/cluster/b")},
			[]events.Edge{e("cluster/a", "cluster/b"), e("network", "cluster/a")}},
		{"exact match wins over a suffix match",
			[]string{"stacks/a", "a"},
			[]events.Edge{e("stacks/a", "a")},
			[]events.Edge{e("stacks/a", "a")}},
		{"ambiguous suffix dropped",
			[]string{"x/a", "a", "b"},
			[]events.Edge{e("/p/x/a", "/p/b"), e("/p/b", "/p/a")},
			[]events.Edge{e("b", "a")}},
		{"unknown endpoints dropped, no partial segment match",
			[]string{"network", "a"},
			[]events.Edge{e("/stacks/othernetwork", "/stacks/a"), e("/stacks/nope", "/stacks/a")},
			[]events.Edge{}},
		{"duplicates and self edges removed, sorted",
			[]string{"a", "b", "c"},
			[]events.Edge{e("/s/c", "/s/a"), e("/s/b", "/s/a"), e("/t/b", "/s/a"), e("/s/a", "/s/a")},
			[]events.Edge{e("b", "a"), e("c", "a")}},
		{"stacks with spaces",
			[]string{"odd name", "network"},
			[]events.Edge{e("/stacks/nonprod/network", "/stacks/nonprod/odd name")},
			[]events.Edge{e("network", "odd name")}},
	}
	for _, tt := range tests {
		got := NormalizeEdges(tt.stacks, tt.edges)
		if got == nil || !slices.Equal(got, tt.want) {
			t.Errorf("%s: NormalizeEdges = %#v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestCycleStacks(t *testing.T) {
	t.Parallel()
	e := func(from, to string) events.Edge { return events.Edge{From: from, To: to} }
	if got := cycleStacks([]events.Edge{e("a", "b"), e("b", "c"), e("a", "c")}); got != nil {
		t.Errorf("acyclic: %v", got)
	}
	got := cycleStacks([]events.Edge{e("x", "a"), e("a", "b"), e("b", "c"), e("c", "a"), e("c", "d"), e("s", "s")})
	if want := []string{"a", "b", "c", "s"}; !slices.Equal(got, want) {
		t.Errorf("cycleStacks = %v, want %v", got, want)
	}
	// A long chain does not exhaust the goroutine stack (the walk is iterative).
	var chain []events.Edge
	for i := range 200000 {
		chain = append(chain, e(fmt.Sprint(i), fmt.Sprint(i+1)))
	}
	if got := cycleStacks(chain); got != nil {
		t.Errorf("chain: %d cyclic", len(got))
	}
}

func FuzzNormalizeEdges(f *testing.F) {
	f.Add("cluster/a\ncluster/b\nnetwork", "/stacks/nonprod/network>/stacks/nonprod/cluster/a\n/stacks/nonprod/cluster/a>/stacks/nonprod/cluster/b")
	f.Add("stacks/nonprod/odd name\nstacks/prod/network", "/stacks/prod/network>/stacks/nonprod/odd name")
	f.Add("a\nx/a\n/y", "/p/x/a>/y\n//a>a\n/>")
	f.Fuzz(func(t *testing.T, stackList, edgeList string) {
		stacks := strings.Split(stackList, "\n")
		var edges []events.Edge
		for l := range strings.SplitSeq(edgeList, "\n") {
			from, to, _ := strings.Cut(l, ">")
			edges = append(edges, events.Edge{From: from, To: to})
		}
		got := NormalizeEdges(stacks, edges)
		if got == nil {
			t.Fatal("nil result")
		}
		if !slices.IsSortedFunc(got, compareEdges) {
			t.Fatalf("not sorted: %v", got)
		}
		for i, e := range got {
			if !slices.Contains(stacks, e.From) || !slices.Contains(stacks, e.To) || e.From == e.To {
				t.Fatalf("edge %v not between two distinct listed stacks", e)
			}
			if i > 0 && got[i-1] == e {
				t.Fatalf("duplicate %v", e)
			}
		}
		// Normalising again is the identity, and the input order does not matter.
		if again := NormalizeEdges(stacks, got); !slices.Equal(again, got) {
			t.Fatalf("not idempotent: %v then %v", got, again)
		}
		rev := slices.Clone(edges)
		slices.Reverse(rev)
		if other := NormalizeEdges(stacks, rev); !slices.Equal(other, got) {
			t.Fatalf("order-dependent: %v vs %v", got, other)
		}
	})
}

// BenchmarkRunGraph1000 parses and normalises the run graph of 1000 stacks with 3000 edges
// under a tier directory, listed tier-relative.
func BenchmarkRunGraph1000(b *testing.B) {
	dot, stacks := tmBenchRunGraph(1000, 3)
	b.SetBytes(int64(len(dot)))
	b.ReportAllocs()
	var n int
	for b.Loop() {
		edges, err := runGraphEdges(dot)
		if err != nil {
			b.Fatal(err)
		}
		n = len(NormalizeEdges(stacks, edges))
	}
	if n != 3000 {
		b.Fatalf("normalised %d edges, want 3000", n)
	}
}

// benchRunGraph renders, in terramate's format, an acyclic run-graph DOT of n stacks under
// /stacks/nonprod with deps*n distinct edges (each stack runs before the stacks 7, 14, 21 places
// later or, near the end, after those 10, 17, 24 places earlier), and the tier-relative listing.
func tmBenchRunGraph(n, deps int) ([]byte, []string) {
	var b strings.Builder
	b.WriteString("digraph  {\n\t\n")
	stacks := make([]string, n)
	for i := range n {
		stacks[i] = fmt.Sprintf("group-%02d/stack-%04d", i%20, i)
		fmt.Fprintf(&b, "\tn%d[label=\"/stacks/nonprod/%s\"];\n", i+1, stacks[i])
	}
	for i := range n {
		for d := 1; d <= deps; d++ {
			from, to := i, i+7*d
			if to >= n {
				from, to = i-7*d-3, i
			}
			fmt.Fprintf(&b, "\tn%d->n%d;\n", from+1, to+1)
		}
	}
	b.WriteString("\t\n}\n")
	return []byte(b.String()), stacks
}
