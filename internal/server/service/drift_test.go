package service

import (
	"fmt"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// drift announces and finalizes drift execution id of testRepo's prod with results.
func (f *fixture) drift(id string, results ...api.StackResult) {
	f.t.Helper()
	var stacks []string
	for _, r := range results {
		stacks = append(stacks, r.Stack)
	}
	f.now = f.now.Add(time.Hour)
	_, err := f.Init(ctx, runner, &api.Init{ExecutionID: id, Environment: "prod", Op: "drift", Stacks: stacks})
	f.must(err)
	_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: id, Status: "failed", Stacks: results, FinishedAt: f.now})
	f.must(err)
}

func driftSummary(cs []api.DriftCheck) string {
	s := ""
	for _, c := range cs {
		s += fmt.Sprintf("%s:%s:%s:%v ", c.Stack, c.ExecutionID, c.Status, c.Drifted)
	}
	return s
}

// TestDriftRecordedByFinalize: a drift execution's Finalize records each planned or failed
// stack's check (drifted by the runner's flag or by a class of change), leaves a stack it did
// not run at its previous check, and claims, gates and checks nothing; the history and the
// latest per stack read back.
func TestDriftRecordedByFinalize(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.drift("d1",
			api.StackResult{Stack: "a", Status: "succeeded", Class: "no-changes"},
			api.StackResult{Stack: "b", Status: "succeeded", Class: "no-changes", Drifted: true},
			api.StackResult{Stack: "c", Status: "succeeded", Class: "mutating", Counts: api.Counts{Update: 1}},
			api.StackResult{Stack: "d", Status: "failed", Class: "unclassified", Drifted: true},
		)
		first := f.now
		f.drift("d2",
			api.StackResult{Stack: "a", Status: "succeeded", Class: "additive"},
			api.StackResult{Stack: "b", Status: "skipped"},
		)
		got, err := f.Drift(ctx, reader, "", "prod", "", nil)
		f.must(err)
		if want := "a:d2:succeeded:true b:d1:succeeded:true c:d1:succeeded:true d:d1:failed:false "; driftSummary(got) != want {
			t.Fatalf("latest: %s\nwant    %s", driftSummary(got), want)
		}
		if got[2].Counts.Update != 1 || got[2].Class != "mutating" || !got[1].CheckedAt.Equal(first) || got[0].Repo != testRepo {
			t.Fatalf("latest checks' fields: %+v", got)
		}
		hist, err := f.Drift(ctx, reader, "", "prod", "a", nil)
		f.must(err)
		if want := "a:d2:succeeded:true a:d1:succeeded:false "; driftSummary(hist) != want {
			t.Fatalf("history of a: %s, want %s", driftSummary(hist), want)
		}
		one := 1
		if hist, _ := f.Drift(ctx, reader, "", "prod", "a", &one); len(hist) != 1 || hist[0].ExecutionID != "d2" {
			t.Fatalf("history limited to one: %+v", hist)
		}
		claims, _ := f.Claims(ctx, reader, "", "prod")
		checks, _ := f.Checks(ctx, reader, everyRow("prod", 0), "")
		if len(claims) != 0 || len(checks) != 0 {
			t.Fatalf("a drift execution claimed %+v or concluded %+v", claims, checks)
		}
		// A plan's Finalize records no drift, even with the flag.
		_, err = f.Init(ctx, runner, &api.Init{ExecutionID: "p1", Environment: "prod", Op: "plan", PR: 3, Stacks: []string{"z"}})
		f.must(err)
		_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "p1", Status: "succeeded", Stacks: []api.StackResult{{Stack: "z", Status: "succeeded", Class: "additive", Drifted: true}}})
		f.must(err)
		if got, _ := f.Drift(ctx, reader, "", "prod", "z", nil); len(got) != 0 {
			t.Fatalf("a plan recorded drift: %+v", got)
		}
	})
}

// TestDriftAttacks: a drift execution names no PR; a runner cannot record drift in a repository
// it may not act in, nor finalize another principal's drift execution; another repository's
// drift is refused when named and not listed otherwise; bad query values are refused naming the
// field.
func TestDriftAttacks(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "x", Environment: "prod", Op: "drift", PR: 4})
		wantErr(t, err, store.ErrInvalid, "pr 4")
		_, err = f.Init(ctx, runner, &api.Init{ExecutionID: "x", Environment: "prod", Op: "drift", Repo: "evil/other"})
		wantErr(t, err, store.ErrDenied, "evil/other")

		f.drift("d1", api.StackResult{Stack: "a", Status: "succeeded", Class: "mutating"})
		// Another principal of the same repository cannot finalize it (nor re-record it).
		_, err = f.Finalize(ctx, who("intruder"), &api.Finalize{ExecutionID: "d1", Status: "succeeded"})
		wantErr(t, err, store.ErrDenied, "")

		other := Caller{Name: "other", Repositories: []string{"evil/other"}}
		_, err = f.Drift(ctx, other, testRepo, "prod", "", nil)
		wantErr(t, err, store.ErrDenied, testRepo)
		got, err := f.Drift(ctx, other, "", "prod", "", nil)
		f.must(err)
		if len(got) != 0 {
			t.Fatalf("another repository's reader listed %+v", got)
		}
		got, err = f.Drift(ctx, other, "", "prod", "a", nil)
		f.must(err)
		if len(got) != 0 {
			t.Fatalf("another repository's reader read the history %+v", got)
		}
		everyRepo := Caller{Name: "ops"}
		if got, _ := f.Drift(ctx, everyRepo, "", "prod", "", nil); len(got) != 1 {
			t.Fatalf("a reader of every repository: %+v, want the one check", got)
		}
		_, err = f.Drift(ctx, everyRepo, "", "prod", "a", nil)
		wantErr(t, err, store.ErrInvalid, "needs repo")

		zero, big := 0, 501
		for _, c := range []struct {
			env, stack string
			limit      *int
			field      string
		}{
			{"", "", nil, "environment"},
			{"prod\x00", "", nil, "environment"},
			{"prod", "../a", nil, "stack"},
			{"prod", "a", &zero, "limit"},
			{"prod", "a", &big, "limit"},
		} {
			_, err := f.Drift(ctx, reader, "", c.env, c.stack, c.limit)
			wantErr(t, err, store.ErrInvalid, c.field)
		}
	})
}

// TestPruneKeepsTheLatestDriftCheck: retention deletes a pruned drift execution's checks from
// the history, and keeps each stack's latest check.
func TestPruneKeepsTheLatestDriftCheck(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.drift("d-old", api.StackResult{Stack: "a", Status: "succeeded", Class: "mutating"}, api.StackResult{Stack: "b", Status: "succeeded", Class: "no-changes"})
		f.drift("d-new", api.StackResult{Stack: "a", Status: "succeeded", Class: "no-changes"})
		f.now = f.now.Add(100 * 24 * time.Hour)
		n, err := f.PruneExecutions(ctx, 90*24*time.Hour)
		f.must(err)
		if n != 2 {
			t.Fatalf("pruned %d executions, want both drift executions", n)
		}
		hist, err := f.Drift(ctx, reader, "", "prod", "a", nil)
		f.must(err)
		if len(hist) != 0 {
			t.Fatalf("history of a after the prune: %+v, want none", hist)
		}
		latest, err := f.Drift(ctx, reader, "", "prod", "", nil)
		f.must(err)
		if want := "a:d-new:succeeded:false b:d-old:succeeded:false "; driftSummary(latest) != want {
			t.Fatalf("latest after the prune: %s, want %s", driftSummary(latest), want)
		}
	})
}
