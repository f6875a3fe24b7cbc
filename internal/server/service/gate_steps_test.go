package service

import (
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Each step of the gate's decision on its own, on every store: what it accepts and what it
// refuses, with the words that say why.

func TestCheckGateRequest(t *testing.T) {
	ok := api.GateCheck{ExecutionID: "ap", Environment: "prod", PR: 1, SHA: "s",
		Stacks: []api.StackPlan{{Stack: "a", PlanHash: "h", Class: "mutating"}}}
	repo, err := checkGateRequest(runner, &ok)
	if err != nil || repo != testRepo {
		t.Fatalf("a well-formed check: %q %v", repo, err)
	}
	for _, c := range []struct {
		edit func(*api.GateCheck)
		want string
	}{
		{func(in *api.GateCheck) { in.PR = 0 }, "pr must be"},
		{func(in *api.GateCheck) { in.SHA = " " }, "sha is required"},
		{func(in *api.GateCheck) { in.Stacks = nil }, "stacks is required"},
		{func(in *api.GateCheck) { in.Shard = "3/2" }, "is not K/N"},
		{func(in *api.GateCheck) { in.Stacks[0].Class = "bogus" }, "is not one of"},
		{func(in *api.GateCheck) { in.Repo = "acme/other" }, "may not act in"},
	} {
		in := ok
		in.Stacks = append([]api.StackPlan(nil), ok.Stacks...)
		c.edit(&in)
		if _, err := checkGateRequest(runner, &in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", in, err, c.want)
		}
	}
}

func TestGateIdentity(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.plan("p1", "prod", 1, "s", map[string]api.Class{"a": "mutating"})
		in := &api.GateCheck{ExecutionID: "p1", Environment: "prod", PR: 1}
		mine := &store.Lease{Repo: testRepo, ExecutionID: "ap", Environment: "prod", PR: 1, Principal: runner.Name}
		for _, c := range []struct {
			caller Caller
			in     *api.GateCheck
			prev   *store.Lease
			want   string
		}{
			{runner, &api.GateCheck{ExecutionID: "ap", Environment: "prod", PR: 1}, nil, ""},
			{runner, &api.GateCheck{ExecutionID: "ap", Environment: "prod", PR: 1}, mine, ""},
			{who("mallory"), in, nil, "announced by another principal"},
			{runner, &api.GateCheck{ExecutionID: "ap", Environment: "prod", PR: 2}, mine, "already holds a lease for"},
			{who("mallory"), &api.GateCheck{ExecutionID: "ap", Environment: "prod", PR: 1}, mine, "granted to another principal"},
		} {
			f.must(f.Store.Read(ctx, func(tx store.Tx) error {
				_, refusal, err := f.gateIdentity(tx, c.caller, testRepo, c.in, c.prev)
				if err != nil {
					return err
				}
				if refusal == nil && c.want != "" || refusal != nil && (c.want == "" || !strings.Contains(refusal.Error(), c.want)) {
					t.Errorf("%s checking %s of PR %d: %v, want %q", c.caller.Name, c.in.ExecutionID, c.in.PR, refusal, c.want)
				}
				return nil
			}))
		}
	})
}

func TestLatestApplicablePlan(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		key := store.PRKey{Repo: testRepo, Environment: "prod", PR: 1}
		read := func() (*store.Execution, []store.Stack, error) {
			var plan *store.Execution
			var stacks []store.Stack
			var perr error
			f.must(f.Store.Read(ctx, func(tx store.Tx) error { plan, stacks, perr = latestApplicablePlan(tx, key); return nil }))
			return plan, stacks, perr
		}
		_, _, err := read()
		wantErr(t, err, store.ErrPrecondition, "has no plan")
		f.plan("p1", "prod", 1, "s", map[string]api.Class{"a": "mutating"})
		f.plan("p2", "prod", 1, "s", map[string]api.Class{"b": "mutating"})
		plan, stacks, err := read()
		f.must(err)
		if plan.ExecutionID != "p2" || len(stacks) != 1 || stacks[0].Stack != "b" {
			t.Fatalf("latest plan %s with %+v, want p2 with b", plan.ExecutionID, stacks)
		}
		_, err = f.Init(ctx, runner, &api.Init{ExecutionID: "p3", Environment: "prod", Op: "plan", PR: 1, SHA: "s", Stacks: []string{"c"}})
		f.must(err)
		_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "p3", Status: "failed"})
		f.must(err)
		_, _, err = read()
		wantErr(t, err, store.ErrPrecondition, "ended failed")
	})
}

func TestMatchStackSet(t *testing.T) {
	plan := &store.Execution{Execution: api.Execution{ExecutionID: "p1"}}
	stacks := []store.Stack{{StackState: api.StackState{Stack: "a", Class: "mutating", PlanHash: "ha"}}, {StackState: api.StackState{Stack: "b", Class: "destructive", PlanHash: "hb"}},
		{StackState: api.StackState{Stack: "c", Class: "no-changes"}}}
	for _, c := range []struct {
		shard string
		named []api.StackPlan
		want  string
	}{
		{"", []api.StackPlan{{Stack: "a", PlanHash: "ha", Class: "mutating"}, {Stack: "b", PlanHash: "hb", Class: "destructive"}}, ""},
		{"1/2", []api.StackPlan{{Stack: "a", PlanHash: "ha", Class: "mutating"}}, ""},
		{"", []api.StackPlan{{Stack: "a", PlanHash: "ha", Class: "mutating"}}, `changed in the plan but not named: "b"`},
		{"", []api.StackPlan{{Stack: "a", PlanHash: "ha", Class: "mutating"}, {Stack: "b", PlanHash: "hb", Class: "destructive"},
			{Stack: "c", Class: "no-changes"}}, `named but not changed in the plan: "c"`},
		{"1/1", []api.StackPlan{{Stack: "a", PlanHash: "old", Class: "mutating"}}, "stale plan"},
		{"1/1", []api.StackPlan{{Stack: "b", PlanHash: "hb", Class: "mutating"}}, "classifies otherwise"},
	} {
		names, err := matchStackSet(plan, stacks, &api.GateCheck{Shard: c.shard, Stacks: c.named})
		switch {
		case c.want == "" && (err != nil || strings.Join(names, ",") != "a,b"):
			t.Errorf("%s %+v: %v %v, want the plan's changed stacks a,b", c.shard, c.named, names, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s %+v: %v, want %q", c.shard, c.named, err, c.want)
		}
	}
}

func TestGrantsFor(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.plan("p1", "prod", 1, "s", map[string]api.Class{"d": "destructive", "m": "mutating"})
		grants := func() ([]int64, error) {
			var ids []int64
			var gerr error
			f.must(f.Store.Read(ctx, func(tx store.Tx) error {
				plan, stacks, err := latestApplicablePlan(tx, store.PRKey{Repo: testRepo, Environment: "prod", PR: 1})
				if err != nil {
					return err
				}
				ids, gerr = f.grantsFor(tx, plan, stacks, f.now)
				return nil
			}))
			return ids, gerr
		}
		_, err := grants()
		wantErr(t, err, store.ErrDenied, "destructive on ** (stacks d)")
		f.must(f.approve(1, "p1"))
		ids, err := grants()
		if err != nil || len(ids) != 1 {
			t.Fatalf("after the approval: %v %v, want its one grant", ids, err)
		}
	})
}

func TestClaimConflict(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.plan("p1", "prod", 1, "s", map[string]api.Class{"a": "mutating"})
		conflict := func(pr int) error {
			var cerr error
			f.must(f.Store.Read(ctx, func(tx store.Tx) error {
				cerr = claimConflict(tx, store.PRKey{Repo: testRepo, Environment: "prod", PR: pr}, []string{"a", "b"}, f.now)
				return nil
			}))
			return cerr
		}
		f.must(conflict(1))
		wantErr(t, conflict(2), store.ErrDenied, `stack "a" is claimed by PR #1 (execution p1)`)
	})
}

func TestNextLease(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		key := store.PRKey{Repo: testRepo, Environment: "prod", PR: 1}
		in := &api.GateCheck{ExecutionID: "ap", Environment: "prod", PR: 1, SHA: "s"}
		d := &decision{plan: &store.Execution{Execution: api.Execution{ExecutionID: "p1"}}, grants: []int64{4}}
		first := f.nextLease(nil, key, in, "ci", "m", d, f.now)
		if !first.GrantedAt.Equal(f.now) || !first.ExpiresAt.Equal(f.now.Add(time.Hour)) || first.Requester != "deployer@proj.iam.gserviceaccount.com" ||
			first.PlanID != "p1" || first.Principal != "ci" {
			t.Fatalf("first lease %+v", first)
		}
		again := f.nextLease(&first, key, in, "ci", "m", d, f.now.Add(10*time.Minute))
		if !again.GrantedAt.Equal(first.GrantedAt) || !again.ExpiresAt.Equal(first.ExpiresAt) {
			t.Fatalf("a re-check's lease granted at %s until %s, want the first grant's %s until %s", again.GrantedAt, again.ExpiresAt,
				first.GrantedAt, first.ExpiresAt)
		}
	})
}
