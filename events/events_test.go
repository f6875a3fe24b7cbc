package events

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The events are the generated wire types; this pins their JSON names to the OpenAPI file so a
// rename there shows up here as a failing round trip, not as silent drift.
func TestRoundTripWireNames(t *testing.T) {
	at := time.Date(2026, 11, 30, 1, 2, 3, 0, time.UTC)
	in := Init{
		ExecutionID: "e1", Repo: "o/r", PR: 7, SHA: "abc", Base: "main", Environment: "prod",
		Op: OpPlan, Actor: "me", RunURL: "https://ci/1", Stacks: []string{"a", "b c"},
		Edges: []Edge{{From: "a", To: "b c"}}, EdgesApproximate: true,
		Reasons:   []ChangeReason{{Stack: "a", Kind: ReasonModule, Detail: "../m", Chain: []string{"x"}, Raw: "r"}},
		StartedAt: at,
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"execution_id", "repo", "pr", "sha", "base", "environment", "op", "actor", "run_url", "stacks", "edges", "edges_approximate", "reasons", "started_at"} {
		if _, ok := m[k]; !ok {
			t.Errorf("Init JSON lacks %q: %s", k, b)
		}
	}
	var back Init
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, back) {
		t.Fatalf("round trip changed Init:\n%+v\n%+v", in, back)
	}

	lc := LogChunk{ExecutionID: "e1", Stack: "s", Generation: 2, Offset: 10, Data: []byte{0, 0xff, 'a'}}
	b, _ = json.Marshal(lc)
	var lc2 LogChunk
	if err := json.Unmarshal(b, &lc2); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(lc, lc2) {
		t.Fatalf("LogChunk round trip: %+v vs %+v", lc, lc2)
	}
}

func TestZeroTimesAreOmitted(t *testing.T) {
	b, _ := json.Marshal(PhaseEvent{ExecutionID: "e", Stack: "s", Phase: "plan"})
	if string(b) != `{"execution_id":"e","phase":"plan","stack":"s"}` {
		t.Fatalf("unexpected JSON %s", b)
	}
}

func TestClassOrder(t *testing.T) {
	order := []Class{ClassNoChanges, ClassAdditive, ClassMutating, ClassDestructive, ClassUnclassified}
	for i := 1; i < len(order); i++ {
		if ClassRank(order[i-1]) >= ClassRank(order[i]) {
			t.Errorf("%s should rank below %s", order[i-1], order[i])
		}
		if got := MaxClass(order[i], order[i-1]); got != order[i] {
			t.Errorf("MaxClass(%s,%s)=%s", order[i], order[i-1], got)
		}
	}
	if MaxClass("", "") != ClassNoChanges {
		t.Error("empty classes should combine to no-changes")
	}
	if ClassRank("bogus") != ClassRank(ClassUnclassified) {
		t.Error("unknown class must rank as unclassified")
	}
}

func TestNameProblem(t *testing.T) {
	for _, c := range []struct{ name, want string }{
		{"stacks/prod/network", ""},
		{"stacks/prod/café ü", ""},
		{strings.Repeat("x", MaxNameLen), ""},
		{"", "is required"},
		{strings.Repeat("x", MaxNameLen+1), "is longer than 1024 bytes"},
		{"caf\xe9", "is not valid UTF-8"},
		{"tab\there", "contains a control character"},
		{"nul\x00", "contains a control character"},
		{"c1\u0085", "contains a control character"},
		{"del\x7f", "contains a control character"},
		{"prod\u202e", "contains a bidirectional formatting or line-separating character"},
		{"a\u2066b\u2069", "contains a bidirectional formatting or line-separating character"},
		{"line\u2028sep", "contains a bidirectional formatting or line-separating character"},
	} {
		if got := NameProblem(c.name); got != c.want {
			t.Errorf("NameProblem(%q) = %q, want %q", c.name, got, c.want)
		}
	}
}
