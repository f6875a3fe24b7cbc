package job

import (
	"testing"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/plan"
)

// TestStackDrifted: a stack drifted when its plan changes anything or shows resource drift,
// even drift no change follows from (a refresh-only plan, or drift under a no-op change); an
// unreadable plan or none is not drift.
func TestStackDrifted(t *testing.T) {
	classified := func(fixture string) *plan.Stack {
		t.Helper()
		s, err := plan.ClassifyFile("s", "../../testdata/tofu/"+fixture+"/plan.json")
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	refresh := classified("refresh-drift")
	if refresh.DriftCount == 0 || refresh.Counts.Total() != 0 {
		t.Fatalf("refresh-drift fixture: drift %d, changes %d; want drift and no resource change", refresh.DriftCount, refresh.Counts.Total())
	}
	for _, c := range []struct {
		name string
		s    *plan.Stack
		want bool
	}{
		{"refresh-only drift", refresh, true},
		{"changes", classified("update"), true},
		{"no changes", classified("no-changes"), false},
		{"drift under a no-op change", &plan.Stack{Class: events.ClassNoChanges, DriftCount: 1}, true},
		{"unclassified", &plan.Stack{Class: events.ClassUnclassified, DriftCount: 3}, false},
		{"no plan", nil, false},
	} {
		if got := stackDrifted(c.s); got != c.want {
			t.Errorf("%s: drifted %v, want %v", c.name, got, c.want)
		}
	}
}
