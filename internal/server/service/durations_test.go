package service

import (
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// An execution read alone carries each ended stack's duration: from its first phase event to
// its last by the times the runner gave them, whatever order they came in. A stack pending or
// running, skipped, or without a phase event has none; the list does not carry them.
func TestExecutionCarriesDurationsOfEndedStacks(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		stacks := []string{"ok", "bad", "stopped", "busy", "waiting", "skip", "quiet", "instant"}
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e", Environment: "prod", Op: "plan", Stacks: stacks})
		f.must(err)
		t0 := time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)
		at := func(d time.Duration) time.Time { return t0.Add(d) }
		phases := []api.PhaseEvent{
			// Out of order on purpose: the span is the times', not the arrival's.
			{Stack: "ok", Phase: "show", Seq: 3, At: at(42*time.Second + 250*time.Millisecond)},
			{Stack: "ok", Phase: "init", Seq: 1, At: at(2 * time.Second)},
			{Stack: "ok", Phase: "plan", Seq: 2, At: at(10 * time.Second)},
			{Stack: "bad", Phase: "init", Seq: 1, At: at(0)},
			{Stack: "bad", Phase: "plan", Seq: 2, At: at(1500 * time.Millisecond)},
			{Stack: "stopped", Phase: "init", Seq: 1, At: at(time.Second)},
			{Stack: "stopped", Phase: "plan", Seq: 2, At: at(time.Minute + time.Second)},
			{Stack: "busy", Phase: "init", Seq: 1, At: at(0)},
			{Stack: "busy", Phase: "plan", Seq: 2, At: at(5 * time.Second)},
			{Stack: "skip", Phase: "init", Seq: 1, At: at(0)},
			{Stack: "skip", Phase: "plan", Seq: 2, At: at(3 * time.Second)},
			{Stack: "instant", Phase: "plan", Seq: 1, At: at(7 * time.Second)},
		}
		for i := range phases {
			phases[i].ExecutionID = "e"
		}
		_, err = f.Phases(ctx, runner, phases)
		f.must(err)
		for _, u := range []api.Update{
			{Stack: "ok", Seq: 4, Status: "succeeded"},
			{Stack: "bad", Seq: 3, Status: "failed", Error: "boom"},
			{Stack: "stopped", Seq: 3, Status: "cancelled"},
			{Stack: "busy", Seq: 3, Status: "running"},
			{Stack: "skip", Seq: 3, Status: "skipped"},
			{Stack: "quiet", Seq: 1, Status: "succeeded"},
			{Stack: "instant", Seq: 2, Status: "succeeded"},
		} {
			u.ExecutionID = "e"
			_, err = f.Update(ctx, runner, &u)
			f.must(err)
		}
		want := map[string]int64{"ok": 40250, "bad": 1500, "stopped": 60000, "instant": 0}
		got := map[string]int64{}
		for name, st := range f.stackStates("e") {
			if st.DurationMS != nil {
				got[name] = *st.DurationMS
			}
		}
		if len(got) != len(want) {
			t.Fatalf("durations %v, want %v (none for busy, waiting, skip, quiet)", got, want)
		}
		for name, ms := range want {
			if g, ok := got[name]; !ok || g != ms {
				t.Fatalf("durations %v, want %v", got, want)
			}
		}
		list, err := f.Executions(ctx, reader, store.ExecutionFilter{Environment: "prod"})
		f.must(err)
		if len(list) != 1 || len(list[0].Stacks) != 0 {
			t.Fatalf("the list carries stacks: %+v", list)
		}
	})
}

// Another repository's reader learns no duration: the execution is not found for it.
func TestExecutionDurationsOfAnotherRepositoryAreNotRead(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e", Environment: "prod", Op: "plan", Stacks: []string{"a"}})
		f.must(err)
		other := Caller{Name: "viewer", Repositories: []string{"acme/other"}}
		_, err = f.Execution(ctx, other, "e")
		wantErr(t, err, store.ErrNotFound, "e")
	})
}
