package service

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// stackState returns one stack of an execution.
func (f *fixture) stackState(id, name string) api.StackState {
	f.t.Helper()
	e, err := f.Execution(ctx, reader, id)
	f.must(err)
	for _, st := range e.Stacks {
		if st.Stack == name {
			return st
		}
	}
	f.t.Fatalf("execution %s has no stack %q: %+v", id, name, e.Stacks)
	return api.StackState{}
}

// gateA checks prod's gate for PR 1 at s1 applying stack a with hash h-a.
func (f *fixture) gateA(id string) (api.GateLease, error) {
	return f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: id, Environment: "prod", PR: 1, SHA: "s1",
		Stacks: []api.StackPlan{{Stack: "a", PlanHash: "h-a"}}})
}

func TestLateEventsDoNotChangeAFinalizedPlan(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.plan("p1", "prod", 1, "s1", map[string]api.Class{"a": "destructive"})
		before := f.stackState("p1", "a")
		// A late (or forged) update with a higher seq tries to declassify the stack.
		ack, err := f.Update(ctx, runner, &api.Update{ExecutionID: "p1", Stack: "a", Seq: 99, Status: "succeeded",
			Class: "no-changes", PlanHash: "forged"})
		f.must(err)
		if ack.Cancel {
			t.Fatalf("ack %+v", ack)
		}
		_, err = f.Phase(ctx, runner, &api.PhaseEvent{ExecutionID: "p1", Stack: "a", Phase: "plan", Status: "late", Seq: 100})
		f.must(err)
		after := f.stackState("p1", "a")
		if after.Class != before.Class || after.PlanHash != before.PlanHash || after.Status != before.Status ||
			after.Counts != before.Counts || after.Phase != before.Phase {
			t.Fatalf("finalized stack changed by late events: before %+v after %+v", before, after)
		}
		// The gate still requires the destructive grant, and the forged hash does not pass.
		_, err = f.gateA("ap1")
		wantErr(t, err, store.ErrDenied, "no active grant approved this plan's content for gate destructive")
		_, err = f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "ap2", Environment: "prod", PR: 1, SHA: "s1",
			Stacks: []api.StackPlan{{Stack: "a", PlanHash: "forged"}}})
		wantErr(t, err, store.ErrDenied, "stale plan")
	})
}

func TestConcurrentWritesOnOneExecutionLoseNothing(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		const rounds = 50
		for i := range rounds {
			id := fmt.Sprint("e", i)
			_, err := f.Init(ctx, runner, &api.Init{ExecutionID: id, Environment: "dev", Op: "plan", PR: 3, SHA: "s", Stacks: []string{"a"}})
			f.must(err)
			var wg sync.WaitGroup
			errs := make(chan error, 2)
			wg.Add(2)
			go func() {
				defer wg.Done()
				_, err := f.Phase(ctx, runner, &api.PhaseEvent{ExecutionID: id, Stack: "a", Phase: "plan", Seq: 1})
				errs <- err
			}()
			go func() {
				defer wg.Done()
				_, err := f.Update(ctx, runner, &api.Update{ExecutionID: id, Stack: "a", Seq: 1, Status: "running", Class: "additive", PlanHash: "h"})
				errs <- err
			}()
			wg.Wait()
			close(errs)
			for err := range errs {
				f.must(err)
			}
			st := f.stackState(id, "a")
			if st.Phase != "plan" || st.Class != "additive" || st.PlanHash != "h" {
				t.Fatalf("round %d: a concurrent write was lost: %+v", i, st)
			}

			// Finalize and an administrator's cancel race: both must stick.
			wg.Add(2)
			errs = make(chan error, 2)
			go func() {
				defer wg.Done()
				_, err := f.Finalize(ctx, runner, &api.Finalize{ExecutionID: id, Status: "succeeded",
					Stacks: []api.StackResult{{Stack: "a", Status: "succeeded", Class: "additive", PlanHash: "h"}}})
				errs <- err
			}()
			go func() {
				defer wg.Done()
				_, err := f.CancelExecution(ctx, who("admin"), &api.ExecutionsCancel{ExecutionID: id, Reason: "stop"})
				errs <- err
			}()
			wg.Wait()
			close(errs)
			for err := range errs {
				f.must(err)
			}
			var e *store.Execution
			f.must(f.Store.Read(ctx, func(tx store.Tx) (err error) { e, err = tx.Execution(id); return }))
			if !e.Finalized || !e.Cancelled {
				t.Fatalf("round %d: finalized=%v cancelled=%v status=%s", i, e.Finalized, e.Cancelled, e.Status)
			}
			if e.Status != "succeeded" && e.Status != "cancelled" {
				t.Fatalf("round %d: status %s", i, e.Status)
			}
		}
	})
}

func TestRepeatedGateCheckIsCheckedAgain(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.plan("p1", "prod", 1, "s1", map[string]api.Class{"a": "mutating"})
		f.plan("d1", "dev", 1, "s1", map[string]api.Class{"a": "mutating"})
		lease, err := f.gateA("ap1")
		f.must(err)
		// The same execution id for another environment or PR does not get prod's requester.
		_, err = f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "ap1", Environment: "dev", PR: 1, SHA: "s1",
			Stacks: []api.StackPlan{{Stack: "a", PlanHash: "h-a"}}})
		wantErr(t, err, store.ErrDenied, "already holds a lease for acme/infra prod PR #1")
		_, err = f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "ap1", Environment: "prod", PR: 2, SHA: "s1",
			Stacks: []api.StackPlan{{Stack: "a", PlanHash: "h-a"}}})
		wantErr(t, err, store.ErrDenied, "already holds a lease")
		// A repeat decides again, and keeps the lease's end (issue 37: a re-check never extends
		// it).
		f.now = f.now.Add(time.Minute)
		again, err := f.gateA("ap1")
		f.must(err)
		if again.Requester != lease.Requester || !again.ExpiresAt.Equal(lease.ExpiresAt) {
			t.Fatalf("repeat %+v, first %+v", again, lease)
		}
		// Another principal cannot take over the execution's lease.
		_, err = f.GateCheck(ctx, who("intruder"), &api.GateCheck{ExecutionID: "ap1", Environment: "prod", PR: 1, SHA: "s1",
			Stacks: []api.StackPlan{{Stack: "a", PlanHash: "h-a"}}})
		wantErr(t, err, store.ErrDenied, "granted to another principal")
		// A newer plan with other content: the repeat is denied, and the lease it held ends.
		f.plan("p2", "prod", 1, "s2", map[string]api.Class{"a": "mutating", "b": "additive"})
		_, err = f.gateA("ap1")
		wantErr(t, err, store.ErrDenied, `stacks changed in the plan but not named: "b"`)
		var l *store.Lease
		f.must(f.Store.Read(ctx, func(tx store.Tx) (err error) { l, err = tx.Lease("ap1"); return }))
		if l.RevokedAt.IsZero() || l.Outcome != "denied on re-check" {
			t.Fatalf("lease after a denied re-check %+v", l)
		}
		_, err = f.gateA("ap1")
		wantErr(t, err, store.ErrDenied, "already revoked")
		entries, err := f.Audit(ctx, reader, "", 100, 0)
		f.must(err)
		outcomes := map[string]int{}
		for _, e := range entries {
			if e.Action == "gate.check" {
				outcomes[e.Outcome]++
			}
		}
		if outcomes["allowed"] != 2 || outcomes["denied"] != 5 {
			t.Fatalf("gate decisions audited %v", outcomes)
		}
	})
}

func TestCancelledExecutionsNeverPassTheGate(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		// A plan cancelled while running stays cancelled even when its runner finalizes success.
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "p1", Environment: "prod", Op: "plan", PR: 1, SHA: "s1", Stacks: []string{"a"}})
		f.must(err)
		_, err = f.CancelExecution(ctx, who("admin"), &api.ExecutionsCancel{ExecutionID: "p1", Reason: "wrong branch"})
		f.must(err)
		ack, err := f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "p1", Status: "succeeded",
			Stacks: []api.StackResult{{Stack: "a", Status: "succeeded", Class: "mutating", PlanHash: "h-a"}}})
		f.must(err)
		if !ack.Cancel {
			t.Fatalf("finalize ack %+v", ack)
		}
		e, err := f.Execution(ctx, reader, "p1")
		f.must(err)
		if e.Status != "cancelled" {
			t.Fatalf("cancelled plan finalized as %s", e.Status)
		}
		if claims, _ := f.Claims(ctx, reader, "", "prod"); len(claims) != 0 {
			t.Fatalf("a cancelled plan claimed %+v", claims)
		}
		_, err = f.gateA("ap1")
		wantErr(t, err, store.ErrPrecondition, "plan p1 of acme/infra prod PR #1 was cancelled")

		// A good plan, then the apply execution itself is cancelled before its gate check.
		f.plan("p2", "prod", 1, "s1", map[string]api.Class{"a": "mutating"})
		_, err = f.Init(ctx, runner, &api.Init{ExecutionID: "ap2", Environment: "prod", Op: "apply", PR: 1, SHA: "s1", Stacks: []string{"a"}})
		f.must(err)
		_, err = f.CancelExecution(ctx, who("admin"), &api.ExecutionsCancel{ExecutionID: "ap2", Reason: "hold"})
		f.must(err)
		_, err = f.gateA("ap2")
		wantErr(t, err, store.ErrDenied, "execution ap2 was cancelled")
		// Cancelling a finalized plan also stops it from passing.
		_, err = f.CancelExecution(ctx, who("admin"), &api.ExecutionsCancel{ExecutionID: "p2", Reason: "bad plan"})
		f.must(err)
		_, err = f.gateA("ap3")
		wantErr(t, err, store.ErrPrecondition, "was cancelled")
	})
}

func TestGateCheckRequiresRequesterShaStacksAndHashes(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		p, err := ParsePolicy("policy.hcl", []byte(testPolicy+`
environment "staging" {
}
`))
		f.must(err)
		f.Policy = p
		f.plan("st1", "staging", 1, "s1", map[string]api.Class{"a": "mutating"})
		_, err = f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "x", Environment: "staging", PR: 1, SHA: "s1",
			Stacks: []api.StackPlan{{Stack: "a", PlanHash: "h-a"}}})
		wantErr(t, err, store.ErrPrecondition, `no requester for environment "staging"`)

		f.plan("p1", "prod", 1, "s1", map[string]api.Class{"a": "mutating"})
		_, err = f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "x", Environment: "prod", PR: 1,
			Stacks: []api.StackPlan{{Stack: "a", PlanHash: "h-a"}}})
		wantErr(t, err, store.ErrInvalid, "sha is required")
		_, err = f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "x", Environment: "prod", PR: 1, SHA: "s1"})
		wantErr(t, err, store.ErrInvalid, "stacks is required")

		// A changed stack finalized without a plan hash never matches, not even an empty one.
		f.now = f.now.Add(time.Second)
		_, err = f.Init(ctx, runner, &api.Init{ExecutionID: "p2", Environment: "prod", Op: "plan", PR: 1, SHA: "s2", Stacks: []string{"a"}})
		f.must(err)
		_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "p2", Status: "succeeded",
			Stacks: []api.StackResult{{Stack: "a", Status: "succeeded", Class: "mutating"}}})
		f.must(err)
		_, err = f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "x", Environment: "prod", PR: 1, SHA: "s2",
			Stacks: []api.StackPlan{{Stack: "a"}}})
		wantErr(t, err, store.ErrPrecondition, `no plan hash for changed stack "a"`)
	})
}

func TestGateRevokeEndsThePRsGrantsAudited(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.plan("p1", "prod", 1, "s1", map[string]api.Class{"a": "destructive"})
		f.must(f.satisfy(who("alice"), &api.GatesSatisfy{PR: 1, Environment: "prod", Class: "destructive", Target: "**", Reason: "ok"}))
		// A glob that is not one of the plan's gates approves nothing: it is refused, naming them.
		err := f.satisfy(who("alice"), &api.GatesSatisfy{PR: 1, Environment: "prod", Class: "destructive", Target: "a", Reason: "ok"})
		wantErr(t, err, store.ErrPrecondition, `requires no gate destructive on "a"; the gates it requires: destructive on ** (a)`)
		_, err = f.GateCheck(ctx, who("ci"), &api.GateCheck{ExecutionID: "ap1", Environment: "prod", PR: 1, SHA: "s1",
			Stacks: []api.StackPlan{{Stack: "a", PlanHash: "h-a"}}})
		f.must(err)
		// Only the principal the lease was granted to (or an admin) ends it.
		_, err = f.GateRevoke(ctx, who("other-runner"), &api.GateRevoke{ExecutionID: "ap1", Outcome: "failed"})
		wantErr(t, err, store.ErrDenied, "admin action")
		// A failed apply also ends the grant it used: it approved that apply.
		_, err = f.GateRevoke(ctx, who("ci"), &api.GateRevoke{ExecutionID: "ap1", Outcome: "failed"})
		f.must(err)
		grants, err := f.Grants(ctx, reader, everyRow("prod", 1), 0)
		f.must(err)
		if len(grants) != 1 || grants[0].ReleasedAt.IsZero() || grants[0].ReleasedBy != "ci" {
			t.Fatalf("grants after revoke %+v, want the one the lease used ended by ci", grants)
		}
		entries, err := f.Audit(ctx, reader, "", 10, 0)
		f.must(err)
		if len(entries) == 0 || entries[0].Action != "gate.revoke" || entries[0].Principal != "ci" ||
			!strings.Contains(entries[0].Detail, "1 grants ended") {
			t.Fatalf("revoke audit %+v", entries)
		}
		_, err = f.gateA("ap2")
		wantErr(t, err, store.ErrDenied, "no active grant")
	})
}

// A gate check naming an execution another principal announced is denied, before the owner
// asked (it would take the lease under that id and block the owner's own check) and after (it
// leaves the owner's lease as it was).
func TestGateCheckOnlyForItsOwnExecution(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.plan("p1", "prod", 1, "s1", map[string]api.Class{"a": "mutating"})
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "ap1", Environment: "prod", Op: "apply", PR: 1, SHA: "s1", Stacks: []string{"a"}})
		f.must(err)
		intrude := func() {
			t.Helper()
			_, err := f.GateCheck(ctx, who("intruder"), &api.GateCheck{ExecutionID: "ap1", Environment: "prod", PR: 1, SHA: "s1",
				Stacks: []api.StackPlan{{Stack: "a", PlanHash: "h-a"}}})
			wantErr(t, err, store.ErrDenied, "execution ap1 was announced by another principal")
		}
		intrude()
		if _, err := f.gateA("ap1"); err != nil {
			t.Fatalf("the owner's check after the intruder's: %v", err)
		}
		intrude()
		if _, err := f.gateA("ap1"); err != nil {
			t.Fatalf("the owner's check after the intruder's, lease held: %v (its lease must still hold)", err)
		}
	})
}
