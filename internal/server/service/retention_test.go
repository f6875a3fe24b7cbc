package service

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Retention deletes the finished executions older than it, with their logs, and keeps what
// something live needs: a plan a gate names, each PR's latest plan, a running execution, and
// everything younger than it.
func TestPruneExecutionsKeepsWhatIsLive(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.planWith("old-plan", 1, "s1", map[string][2]string{"a": {"additive", "h1"}})
		_, err := f.LogChunk(ctx, runner, &api.LogChunk{ExecutionID: "old-plan", Stack: "a", Data: []byte("old log\n")})
		f.must(err)
		f.planWith("latest-plan", 1, "s2", map[string][2]string{"a": {"additive", "h2"}})
		f.planWith("gated-plan", 2, "s1", map[string][2]string{"b": {"destructive", "h3"}})
		f.planWith("gated-plan-2", 2, "s1", map[string][2]string{"b": {"destructive", "h3"}}) // the gate names this one
		_, err = f.Init(ctx, runner, &api.Init{ExecutionID: "old-apply", Environment: "prod", Op: "apply", PR: 5, Stacks: []string{"c"}})
		f.must(err)
		_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "old-apply", Status: "failed"})
		f.must(err)
		_, err = f.Init(ctx, runner, &api.Init{ExecutionID: "still-running", Environment: "prod", Op: "plan", PR: 6, Stacks: []string{"d"}})
		f.must(err)
		f.now = f.now.Add(100 * 24 * time.Hour)
		f.planWith("young-plan", 1, "s3", map[string][2]string{"a": {"additive", "h4"}})
		n, err := f.PruneExecutions(ctx, 90*24*time.Hour)
		f.must(err)
		// gated-plan is its PR's plan no more and no gate names it: it goes too.
		gone := []string{"old-plan", "latest-plan", "gated-plan", "old-apply"}
		if n != int64(len(gone)) {
			t.Fatalf("pruned %d, want %d", n, len(gone))
		}
		for _, id := range gone {
			if _, err := f.Execution(ctx, reader, id); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("%s: %v, want it pruned", id, err)
			}
		}
		if sl, err := f.LogRead(ctx, reader, "old-plan", "a", 0, true, 0, 100); err == nil && len(sl.Data) != 0 {
			t.Errorf("the pruned plan's log reads %q", sl.Data)
		}
		var bytes int64
		f.must(f.Store.Read(ctx, func(tx store.Tx) (err error) { bytes, err = tx.LogBytes("old-plan"); return }))
		if bytes != 0 {
			t.Errorf("%d log bytes of the pruned plan left", bytes)
		}
		for _, id := range []string{"gated-plan-2", "still-running", "young-plan"} {
			if _, err := f.Execution(ctx, reader, id); err != nil {
				t.Errorf("%s: %v, want it kept", id, err)
			}
		}
		if n, err := f.PruneExecutions(ctx, 90*24*time.Hour); err != nil || n != 0 {
			t.Fatalf("second prune: %d, %v", n, err)
		}
	})
}

// A principal that announced ExecutionsPerHour executions in the last hour gets ErrQuota with
// the time until one leaves the hour; a retried Init of one of them and an admin's are taken.
// Log bytes past LogBytesPerExecution are refused, counted from the store by a new replica.
func TestQuotas(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.Quotas = Quotas{ExecutionsPerHour: 3, LogBytesPerExecution: 10}
		initE := func(c Caller, id string) error {
			_, err := f.Init(ctx, c, &api.Init{ExecutionID: id, Environment: "prod", Op: "plan", PR: 1, Stacks: []string{"a"}})
			return err
		}
		for i, id := range []string{"e1", "e2", "e3"} {
			f.must(initE(runner, id))
			if i == 0 {
				f.now = f.now.Add(10 * time.Minute)
			}
		}
		err := initE(runner, "e4")
		var qe *QuotaError
		if !errors.As(err, &qe) || !errors.Is(err, store.ErrQuota) || qe.Wait != 50*time.Minute || !strings.Contains(err.Error(), "3 executions in the last hour") {
			t.Fatalf("the fourth execution in an hour: %v", err)
		}
		if _, err := f.Execution(ctx, reader, "e4"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a refused Init stored its execution: %v", err)
		}
		f.must(initE(runner, "e1"))
		f.must(initE(adminOf("root"), "a1"))
		f.now = f.now.Add(50*time.Minute + time.Second)
		f.must(initE(runner, "e4"))

		log := func(s *Service, data string, off int64) error {
			_, err := s.LogChunk(ctx, runner, &api.LogChunk{ExecutionID: "e1", Stack: "a", Offset: off, Data: []byte(data)})
			return err
		}
		f.must(log(f.Service, "123456", 0))
		f.must(log(f.Service, "123456", 0)) // a resend is not counted again
		f.must(log(f.Service, "789abc", 6)) // reaches the limit: taken whole
		if err := log(f.Service, "d", 12); !errors.Is(err, store.ErrQuota) || !strings.Contains(err.Error(), "has 12 bytes of logs stored, the 10 bytes") {
			t.Fatalf("past the log quota: %v", err)
		}
		other := New(f.Store, f.Policy)
		other.Quotas, other.Now = f.Quotas, f.Now
		if err := log(other, "d", 12); !errors.Is(err, store.ErrQuota) {
			t.Fatalf("another replica past the log quota: %v", err)
		}
	})
}
