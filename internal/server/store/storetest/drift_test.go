package storetest

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

func driftCheck(repo, stack, exec string, at time.Time, drifted bool) api.DriftCheck {
	c := api.DriftCheck{Repo: repo, Environment: "prod", Stack: stack, ExecutionID: exec, CheckedAt: at, Status: "succeeded", Class: "no-changes"}
	if drifted {
		c.Drifted, c.Class, c.Counts = true, "mutating", api.Counts{Update: 2, Create: 1}
	}
	return c
}

func latestDrift(t *testing.T, s store.Store, repo, env string) []api.DriftCheck {
	t.Helper()
	var out []api.DriftCheck
	write(t, s, func(tx store.Tx) (err error) { out, err = tx.LatestDrift(repo, env); return })
	return out
}

// TestDriftChecks: each stack's checks are kept as a history, newest first and bounded by the
// limit; the latest per stack is the one of the latest time, whatever order the executions were
// finalized in; a check recorded twice is kept once; repositories and environments stay apart.
func TestDriftChecks(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		day := 24 * time.Hour
		write(t, s, func(tx store.Tx) error {
			return tx.AddDriftChecks([]api.DriftCheck{
				driftCheck("o/a", "stacks/x", "e1", t0, false),
				driftCheck("o/a", "stacks/y", "e1", t0, true),
				driftCheck("o/b", "stacks/x", "f1", t0, true),
			})
		})
		// The third day's run finalizes before the second day's (a slow job).
		write(t, s, func(tx store.Tx) error {
			return tx.AddDriftChecks([]api.DriftCheck{driftCheck("o/a", "stacks/x", "e3", t0.Add(2*day), true)})
		})
		second := []api.DriftCheck{driftCheck("o/a", "stacks/x", "e2", t0.Add(day), false), driftCheck("o/a", "stacks/y", "e2", t0.Add(day), false)}
		write(t, s, func(tx store.Tx) error { return tx.AddDriftChecks(second) })
		write(t, s, func(tx store.Tx) error { return tx.AddDriftChecks(second) }) // again: kept once

		got := latestDrift(t, s, "o/a", "prod")
		want := []api.DriftCheck{driftCheck("o/a", "stacks/x", "e3", t0.Add(2*day), true), driftCheck("o/a", "stacks/y", "e2", t0.Add(day), false)}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("latest of o/a:\n got %+v\nwant %+v", got, want)
		}
		if got := latestDrift(t, s, "", "prod"); len(got) != 3 || got[2].Repo != "o/b" || !got[2].Drifted {
			t.Fatalf("latest of every repository: %+v, want o/a's two then o/b's", got)
		}
		if got := latestDrift(t, s, "o/a", "staging"); len(got) != 0 {
			t.Fatalf("another environment: %+v, want none", got)
		}

		var hist []api.DriftCheck
		write(t, s, func(tx store.Tx) (err error) { hist, err = tx.DriftHistory("o/a", "prod", "stacks/x", 10); return })
		var ids []string
		for _, c := range hist {
			ids = append(ids, c.ExecutionID)
		}
		if fmt.Sprint(ids) != "[e3 e2 e1]" || hist[0].Counts != (api.Counts{Update: 2, Create: 1}) || !hist[0].CheckedAt.Equal(t0.Add(2*day)) {
			t.Fatalf("history of o/a stacks/x: %+v, want e3, e2, e1 with e3's counts and time", hist)
		}
		write(t, s, func(tx store.Tx) (err error) { hist, err = tx.DriftHistory("o/a", "prod", "stacks/x", 1); return })
		if len(hist) != 1 || hist[0].ExecutionID != "e3" {
			t.Fatalf("history limited to 1: %+v, want e3 alone", hist)
		}
	})
}

// TestDriftChecksMany: a drift run of more stacks than one statement inserts is recorded whole.
func TestDriftChecksMany(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s store.Store) {
		var cs []api.DriftCheck
		for i := range 150 {
			cs = append(cs, driftCheck("o/a", fmt.Sprintf("s/%03d", i), "e1", t0, i%7 == 0))
		}
		write(t, s, func(tx store.Tx) error { return tx.AddDriftChecks(cs) })
		got := latestDrift(t, s, "o/a", "prod")
		if !reflect.DeepEqual(got, cs) {
			t.Fatalf("latest of 150 stacks: got %d, want them all as recorded", len(got))
		}
	})
}
