package runner

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/events"
)

func TestRunGraphEdgesRecorded(t *testing.T) {
	t.Parallel()
	e := func(from, to string) events.Edge { return events.Edge{From: from, To: to} }
	got, err := runGraphEdges(tmRecordedBytes(t, "10-run-graph-dir"))
	if err != nil {
		t.Fatal(err)
	}
	want := []events.Edge{
		e("/stacks/nonprod/cluster/a", "/stacks/nonprod/cluster/b"),
		e("/stacks/nonprod/network", "/stacks/nonprod/cluster/a"),
		e("/stacks/nonprod/network", "/stacks/nonprod/cluster/b"),
		e("/stacks/prod/network", "/stacks/prod/cluster/a"),
	}
	if !slices.Equal(got, want) {
		t.Errorf("edges = %v, want %v", got, want)
	}
	got, err = runGraphEdges(tmRecordedBytes(t, "29-space-run-graph"))
	if err != nil || !slices.Contains(got, e("/stacks/prod/network", "/stacks/prod/cluster/a")) || len(got) != 4 {
		t.Errorf("space case: %v, %v", got, err)
	}
	_, err = runGraphEdges(tmRecordedBytes(t, "23-cycle-run-graph"))
	var ce *StackCycleError
	if !errors.As(err, &ce) || !errors.Is(err, ErrStackCycle) ||
		!slices.Equal(ce.Stacks, []string{"/stacks/nonprod/cluster/a", "/stacks/nonprod/cluster/b", "/stacks/nonprod/network"}) {
		t.Errorf("cycle case: %v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "/stacks/nonprod/network") {
		t.Errorf("cycle message does not name the stacks: %s", msg)
	}
}

func TestParseDOTSyntax(t *testing.T) {
	t.Parallel()
	src := `/* leading comment */
strict digraph "g" {
# preprocessor-style line
	graph [rankdir=LR]; node [shape=box]
	rankdir = "TB"
	n1 [label="/stacks/with \"quote\"", shape=box];
	n2 [label = <b<i>x</i>>]
	"n 3" [label="/stacks/a" + "/b"]
	n1 -> n2 -> "n 3" [color="red:blue", style=bold] // a chain
	n4:port:ne -> { n5 n6 }
	subgraph cluster_x { n7 -> n8 }
}`
	g, err := parseDOT([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if got := g.label("n1"); got != `/stacks/with "quote"` {
		t.Errorf("n1 label %q", got)
	}
	if got := g.label("n2"); got != "b<i>x</i>" {
		t.Errorf("n2 label %q", got)
	}
	if got := g.label("n 3"); got != "/stacks/a/b" {
		t.Errorf("n 3 label %q", got)
	}
	want := []dotEdge{{"n1", "n2", true}, {"n2", "n 3", true}, {"n4", "n5", false}, {"n4", "n6", false}, {"n7", "n8", false}}
	if !slices.Equal(g.edges, want) {
		t.Errorf("edges = %+v, want %+v", g.edges, want)
	}
}

func TestParseDOTErrors(t *testing.T) {
	t.Parallel()
	for _, src := range []string{
		"",
		"graph { a -- b }",
		"digraph { a -> }",
		"digraph { a -> b",
		`digraph { a [label="unterminated] }`,
		"digraph { /* open",
		"digraph { a [label=] }",
		"digraph { a @ b }",
		"digraph {" + strings.Repeat("{", 200) + strings.Repeat("}", 201),
	} {
		if _, err := parseDOT([]byte(src)); err == nil {
			t.Errorf("parseDOT(%q) accepted", src)
		}
	}
}

// Long concatenations keep every part, in order, escaped or not, and in several labels; an
// edge between two subgraphs that would stand for more than maxDOTEdges pairs is refused.
func TestParseDOTConcatenationAndProductBounds(t *testing.T) {
	t.Parallel()
	var parts []string
	for i := range 3000 {
		if i%2 == 0 {
			parts = append(parts, fmt.Sprintf(`"p%d/"`, i))
		} else {
			parts = append(parts, fmt.Sprintf(`"q\"%d/"`, i))
		}
	}
	src := "digraph {\n a [label=" + strings.Join(parts, " + ") + "]\n b [label=\"x\" + \"y\"]\n a -> b\n}"
	g, err := parseDOT([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for i := range 3000 {
		if i%2 == 0 {
			fmt.Fprintf(&want, "p%d/", i)
		} else {
			fmt.Fprintf(&want, "q\"%d/", i)
		}
	}
	if got := g.label("a"); got != want.String() {
		t.Fatalf("label of a: %d bytes, want %d", len(got), want.Len())
	}
	if got := g.label("b"); got != "xy" {
		t.Fatalf("label of b %q", got)
	}
	side := func(prefix string) string {
		var ids []string
		for i := range 1100 {
			ids = append(ids, fmt.Sprint(prefix, i))
		}
		return "{" + strings.Join(ids, " ") + "}"
	}
	if _, err := parseDOT([]byte("digraph { " + side("a") + " -> " + side("b") + " }")); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("a product of 1,210,000 edges: err %v", err)
	}
}

// BenchmarkParseDOTConcatenation: one label of 20,000 quoted parts joined by '+' (each part
// used to copy the label so far: 1.9 s for 20,000 parts in the audit).
func BenchmarkParseDOTConcatenation(b *testing.B) {
	src := "digraph { a [label=" + strings.TrimSuffix(strings.Repeat(`"/stacks/abc" + `, 20000), " + ") + "] }"
	for b.Loop() {
		if _, err := parseDOT([]byte(src)); err != nil {
			b.Fatal(err)
		}
	}
}

func FuzzParseDOT(f *testing.F) {
	cases, _ := filepath.Glob(filepath.Join(tmFixtureDir, "cases", "*run-graph*.stdout"))
	for _, c := range cases {
		f.Add(tmRecordedBytes(f, strings.TrimSuffix(filepath.Base(c), ".stdout")))
	}
	f.Add([]byte(`digraph { a -> b -> {c d} [color=red]; subgraph s { e -> a } "x\"y" [label=<<b>z</b>>] }`))
	f.Fuzz(func(t *testing.T, src []byte) {
		g, err := parseDOT(src)
		if err != nil {
			return
		}
		edges, err := runGraphEdges(src)
		if len(edges) > len(g.edges) {
			t.Fatalf("%d edges from %d DOT edges", len(edges), len(g.edges))
		}
		if !slices.IsSortedFunc(edges, compareEdges) {
			t.Fatalf("edges not sorted: %v", edges)
		}
		var ce *StackCycleError
		if err != nil && !errors.As(err, &ce) {
			t.Fatalf("a parsed graph failed with %v", err)
		}
		if (cycleStacks(edges) != nil) && ce == nil {
			t.Fatalf("cyclic graph without a cycle error: %v", edges)
		}
	})
}
