package service

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// stackStates returns an execution's stacks by name, without their update times.
func (f *fixture) stackStates(id string) map[string]api.StackState {
	f.t.Helper()
	x, err := f.Execution(ctx, reader, id)
	f.must(err)
	out := map[string]api.StackState{}
	for _, st := range x.Stacks {
		st.UpdatedAt = time.Time{}
		out[st.Stack] = st
	}
	return out
}

// A batch of updates leaves each stack as the same updates sent one by one with Update do
// (newest seq wins, the later of equal seqs wins, a retry changes nothing).
func TestUpdatesBatchStoresEachAsUpdateDoes(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		for _, id := range []string{"batch", "single"} {
			_, err := f.Init(ctx, runner, &api.Init{ExecutionID: id, Environment: "prod", Op: "plan", Stacks: []string{"a", "b", "c"}})
			f.must(err)
		}
		updates := func(id string) []api.Update {
			return []api.Update{
				{ExecutionID: id, Stack: "b", Seq: 1, Status: "running"},
				{ExecutionID: id, Stack: "a", Seq: 2, Status: "succeeded", Class: "destructive", PlanHash: "v1:a2",
					Counts: api.Counts{Delete: 1}, Destructive: []string{"aws_db.main"}},
				{ExecutionID: id, Stack: "a", Seq: 1, Status: "running", PlanHash: "v1:a1"}, // older: loses
				{ExecutionID: id, Stack: "c", Seq: 5, Status: "failed", Error: "boom"},
				{ExecutionID: id, Stack: "b", Seq: 3, Status: "succeeded", Class: "additive", PlanHash: "v1:b3"},
				{ExecutionID: id, Stack: "c", Seq: 5, Status: "succeeded", Class: "no-changes", PlanHash: "v1:c5"}, // equal seq, later: wins
			}
		}
		_, err := f.Updates(ctx, runner, updates("batch"))
		f.must(err)
		for _, u := range updates("single") {
			_, err := f.Update(ctx, runner, &u)
			f.must(err)
		}
		got, want := f.stackStates("batch"), f.stackStates("single")
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("batched updates stored\n%+v\none by one\n%+v", got, want)
		}
		if a, b, c := got["a"], got["b"], got["c"]; a.PlanHash != "v1:a2" || a.Class != "destructive" || len(a.Destructive) != 1 ||
			b.Status != "succeeded" || b.PlanHash != "v1:b3" || c.Status != "succeeded" || c.PlanHash != "v1:c5" || c.Error != "" {
			t.Fatalf("stacks after the batch: %+v", got)
		}
		f.now = f.now.Add(time.Minute)
		_, err = f.Updates(ctx, runner, updates("batch")) // a retry
		f.must(err)
		if again := f.stackStates("batch"); !reflect.DeepEqual(again, got) {
			t.Fatalf("a retried batch changed the stacks: %+v, was %+v", again, got)
		}
	})
}

// A batch is refused whole, with INVALID_ARGUMENT or NOT_FOUND, when it is empty, too long,
// mixes executions, names an unknown execution or holds one update Update would refuse; a
// refused batch stores nothing, not even its valid updates.
func TestUpdatesBatchRefusedWhole(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		for _, id := range []string{"e1", "e2"} {
			_, err := f.Init(ctx, runner, &api.Init{ExecutionID: id, Environment: "prod", Op: "plan", Stacks: []string{"a", "b"}})
			f.must(err)
		}
		before := f.stackStates("e1")
		valid := func(stack string) api.Update {
			return api.Update{ExecutionID: "e1", Stack: stack, Seq: 10, Status: "succeeded", Class: "mutating", PlanHash: "v1:" + stack}
		}
		with := func(bad api.Update) []api.Update { return []api.Update{valid("a"), bad, valid("b")} }
		nul := valid("b")
		nul.PlanHash = "v1:\x00"
		badAddr := valid("b")
		badAddr.Destructive = []string{"ok.one", "bad\x00"}
		for _, c := range []struct {
			name    string
			batch   []api.Update
			want    error
			mention string
		}{
			{"empty", nil, store.ErrInvalid, "empty"},
			{"too many", make([]api.Update, MaxUpdates+1), store.ErrInvalid, fmt.Sprint("more than ", MaxUpdates)},
			{"two executions", with(api.Update{ExecutionID: "e2", Stack: "b", Seq: 10, Status: "succeeded"}), store.ErrInvalid, "one execution"},
			{"no stack", with(api.Update{ExecutionID: "e1", Seq: 10, Status: "succeeded"}), store.ErrInvalid, "stack is required"},
			{"no execution", with(api.Update{Stack: "b", Seq: 10, Status: "succeeded"}), store.ErrInvalid, "execution_id is required"},
			{"bad status", with(api.Update{ExecutionID: "e1", Stack: "b", Seq: 10, Status: "done"}), store.ErrInvalid, "status"},
			{"bad class", with(api.Update{ExecutionID: "e1", Stack: "b", Seq: 10, Status: "succeeded", Class: "scary"}), store.ErrInvalid, "class"},
			{"control character in stack", with(api.Update{ExecutionID: "e1", Stack: "b\n", Seq: 10, Status: "succeeded"}), store.ErrInvalid, "control character"},
			{"NUL in plan hash", with(nul), store.ErrInvalid, "plan_hash"},
			{"NUL in an address", with(badAddr), store.ErrInvalid, "destructive address"},
			{"unknown execution", []api.Update{{ExecutionID: "nope", Stack: "a", Seq: 10, Status: "succeeded"}, {ExecutionID: "nope", Stack: "b", Seq: 10, Status: "succeeded"}}, store.ErrNotFound, "nope"},
		} {
			t.Run(c.name, func(t *testing.T) {
				_, err := f.Updates(ctx, runner, c.batch)
				wantErr(t, err, c.want, c.mention)
				if after := f.stackStates("e1"); !reflect.DeepEqual(after, before) {
					t.Fatalf("a refused batch changed e1: %+v, was %+v", after, before)
				}
			})
		}
		// The single form refuses what the batch refuses, with the same words.
		_, err := f.Update(ctx, runner, &api.Update{ExecutionID: "e1", Stack: "b", Seq: 10, Status: "done"})
		wantErr(t, err, store.ErrInvalid, `status "done" is not a stack status`)
	})
}

// Once the execution is finalized a batch changes nothing (and is not an error); once it is
// cancelled the batch's answer says so.
func TestUpdatesBatchAfterFinalizeAndCancel(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.plan("p1", "prod", 1, "s1", map[string]api.Class{"a": "destructive", "b": "additive"})
		before := f.stackStates("p1")
		ack, err := f.Updates(ctx, runner, []api.Update{
			{ExecutionID: "p1", Stack: "a", Seq: 99, Status: "succeeded", Class: "no-changes", PlanHash: "forged"},
			{ExecutionID: "p1", Stack: "b", Seq: 99, Status: "failed"},
		})
		f.must(err)
		if ack.Cancel {
			t.Fatalf("ack %+v", ack)
		}
		if after := f.stackStates("p1"); !reflect.DeepEqual(after, before) {
			t.Fatalf("late batch changed a finalized plan: %+v, was %+v", after, before)
		}
		_, err = f.Init(ctx, runner, &api.Init{ExecutionID: "e2", Environment: "prod", Op: "plan", Stacks: []string{"a", "b"}})
		f.must(err)
		_, err = f.CancelExecution(ctx, who("alice"), &api.ExecutionsCancel{ExecutionID: "e2", Reason: "wrong branch"})
		f.must(err)
		ack, err = f.Updates(ctx, runner, []api.Update{{ExecutionID: "e2", Stack: "b", Seq: 1, Status: "running"}, {ExecutionID: "e2", Stack: "a", Seq: 1, Status: "running"}})
		f.must(err)
		if !ack.Cancel || ack.Reason != "wrong branch" {
			t.Fatalf("ack after cancel %+v", ack)
		}
	})
}

// failingStore fails the n-th ApplyUpdate of a transaction, after the earlier ones succeeded,
// and every ApplyUpdates after it wrote its updates.
type failingStore struct {
	store.Store
	n int
}

var errInjected = errors.New("injected store failure")

func (s failingStore) Write(c context.Context, fn func(store.Tx) error) error {
	return s.Store.Write(c, func(tx store.Tx) error { return fn(&failingTx{Tx: tx, left: s.n}) })
}

type failingTx struct {
	store.Tx
	left int
}

func (t *failingTx) ApplyUpdate(execID string, s *store.Stack) (store.EventState, bool, error) {
	if t.left--; t.left == 0 {
		return store.EventState{}, false, errInjected
	}
	return t.Tx.ApplyUpdate(execID, s)
}

func (t *failingTx) ApplyUpdates(execID string, ss []*store.Stack) (store.EventState, int64, error) {
	if _, _, err := t.Tx.ApplyUpdates(execID, ss); err != nil {
		return store.EventState{}, 0, err
	}
	return store.EventState{}, 0, errInjected
}

// A store failure part way through a batch rolls back the updates already written.
func TestUpdatesBatchAllOrNothing(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", Stacks: []string{"a", "b", "c"}})
		f.must(err)
		before := f.stackStates("e1")
		failing := New(failingStore{Store: f.Store, n: 3}, nil)
		_, err = failing.Updates(ctx, runner, []api.Update{
			{ExecutionID: "e1", Stack: "a", Seq: 1, Status: "succeeded", PlanHash: "v1:a"},
			{ExecutionID: "e1", Stack: "b", Seq: 1, Status: "succeeded", PlanHash: "v1:b"},
			{ExecutionID: "e1", Stack: "c", Seq: 1, Status: "succeeded", PlanHash: "v1:c"},
		})
		if !errors.Is(err, errInjected) {
			t.Fatalf("err = %v, want the injected failure", err)
		}
		if after := f.stackStates("e1"); !reflect.DeepEqual(after, before) {
			t.Fatalf("a failed batch left writes behind: %+v, was %+v", after, before)
		}
	})
}
