package service

import (
	"context"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// An execution the server has heard nothing of for --stale-after is failed with "runner
// stopped reporting", and nothing else changes: the claims of its PR and the lease its gate
// check took stay. An event or a heartbeat counts as hearing from it; a heartbeat after the
// sweep sets it running again, and the runner's Finalize still ends it as the runner says.
func TestSweepStaleFailsSilentExecutionsOnly(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		const staleAfter = 5 * time.Minute
		f.planWith("p1", 7, "head", map[string][2]string{"a": {"additive", "h-a"}})
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "ap1", Environment: "prod", Op: "apply", PR: 7, SHA: "head", Stacks: []string{"a"}})
		f.must(err)
		_, err = f.check("ap1", 7, api.StackPlan{Stack: "a", PlanHash: "h-a"})
		f.must(err)
		for _, id := range []string{"beats", "chatty"} {
			_, err = f.Init(ctx, runner, &api.Init{ExecutionID: id, Environment: "prod", Op: "plan", PR: 8, Stacks: []string{"a"}})
			f.must(err)
		}
		sweep := func(want int) {
			t.Helper()
			n, err := f.SweepStale(ctx, staleAfter, 100)
			if err != nil || n != want {
				t.Fatalf("at %s: swept %d, %v; want %d", f.now.Format(time.TimeOnly), n, err, want)
			}
		}
		status := func(id string) *api.Execution {
			t.Helper()
			x, err := f.Execution(ctx, reader, id)
			f.must(err)
			return x
		}
		f.now = f.now.Add(4 * time.Minute)
		_, err = f.Heartbeat(ctx, runner, &api.Heartbeat{ExecutionID: "beats"})
		f.must(err)
		_, err = f.Phase(ctx, runner, &api.PhaseEvent{ExecutionID: "chatty", Stack: "a", Phase: "plan", Seq: 1})
		f.must(err)
		sweep(0)
		f.now = f.now.Add(2 * time.Minute) // ap1: 6 minutes of silence; the others 2
		sweep(1)
		x := status("ap1")
		if x.Status != events.ExecutionFailed || x.Error != StaleError || !x.FinishedAt.Equal(f.now) {
			t.Fatalf("stale execution: %s %q finished %s", x.Status, x.Error, x.FinishedAt)
		}
		for _, id := range []string{"beats", "chatty", "p1"} {
			if x := status(id); x.Error != "" || (id != "p1" && x.Status != events.ExecutionRunning) {
				t.Fatalf("%s: %s %q", id, x.Status, x.Error)
			}
		}
		var lease *store.Lease
		var claims []api.Claim
		f.must(f.Store.Read(ctx, func(tx store.Tx) (err error) {
			if lease, err = tx.Lease("ap1"); err != nil {
				return err
			}
			claims, err = tx.Claims(testRepo, "prod", f.now)
			return err
		}))
		if !lease.RevokedAt.IsZero() || len(claims) != 1 || claims[0].PR != 7 {
			t.Fatalf("the sweep released something: lease %+v, claims %+v", lease, claims)
		}
		audit, err := f.Audit(ctx, reader, testRepo, 10, 0)
		f.must(err)
		if len(audit) == 0 || audit[0].Action != "executions.stale" || audit[0].Target != "ap1" {
			t.Fatalf("audit %+v", audit)
		}
		// The runner was only cut off: its heartbeat sets the execution running again.
		_, err = f.Heartbeat(ctx, runner, &api.Heartbeat{ExecutionID: "ap1"})
		f.must(err)
		if x := status("ap1"); x.Status != events.ExecutionRunning || x.Error != "" || !x.FinishedAt.IsZero() {
			t.Fatalf("after a heartbeat: %s %q %s", x.Status, x.Error, x.FinishedAt)
		}
		f.now = f.now.Add(staleAfter + time.Second)
		sweep(3)
		_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "ap1", Status: "succeeded",
			Stacks: []api.StackResult{{Stack: "a", Status: "succeeded"}}})
		f.must(err)
		if x := status("ap1"); x.Status != events.ExecutionSucceeded || x.Error != "" {
			t.Fatalf("the Finalize after the sweep: %s %q", x.Status, x.Error)
		}
		f.now = f.now.Add(time.Hour)
		sweep(0)
		// Only the execution's principal heartbeats it.
		_, err = f.Heartbeat(ctx, who("mallory"), &api.Heartbeat{ExecutionID: "beats"})
		wantErr(t, err, store.ErrDenied, "")
	})
}

// RunStaleSweeper fails a silent execution once staleAfter has passed, and returns when its
// context ends (on the real clock, with short durations).
func TestRunStaleSweeper(t *testing.T) {
	s := New(storetest.OpenSQLite(t), nil)
	_, err := s.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", PR: 1, Stacks: []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	started := time.Now()
	go func() {
		defer close(done)
		s.RunStaleSweeper(sctx, 200*time.Millisecond, 10*time.Millisecond, func(err error) { t.Error(err) })
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		x, err := s.Execution(ctx, reader, "e1")
		if err != nil {
			t.Fatal(err)
		}
		if x.Status == events.ExecutionFailed {
			if x.Error != StaleError || time.Since(started) < 200*time.Millisecond {
				t.Fatalf("failed %q after %v", x.Error, time.Since(started))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sweeper never failed the silent execution")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
}
