package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

const testPolicy = `
claim_ttl = "24h"
environment "prod" {
  requester = "deployer@proj.iam.gserviceaccount.com"
  lease_ttl = "1h"
  gate {
    classes = ["destructive"]
    stacks  = ["**"]
  }
}
environment "dev" {
  requester = "dev-deployer@proj.iam.gserviceaccount.com"
}
`

var ctx = context.Background()

type fixture struct {
	*Service
	t   *testing.T
	now time.Time
}

// GateCheck is the service's GateCheck with the class of each named stack the test left
// unset filled in as an apply that agrees with the plan would send it: the class the PR's latest
// plan reported for that stack (unclassified when the plan has no such stack). Tests of an apply
// that classifies otherwise set the class themselves.
func (f *fixture) GateCheck(ctx context.Context, c Caller, in *api.GateCheck) (api.GateLease, error) {
	f.t.Helper()
	filled := *in
	filled.Stacks = slices.Clone(in.Stacks)
	repo := cmp.Or(strings.ToLower(in.Repo), testRepo)
	if len(c.Repositories) == 1 && in.Repo == "" {
		repo = c.Repositories[0]
	}
	if c.GitHub != nil && in.Repo == "" {
		repo = c.GitHub.Repository
	}
	classes := map[string]events.Class{}
	_ = f.Store.Read(ctx, func(tx store.Tx) error {
		p, err := tx.LatestPlan(store.PRKey{Repo: repo, Environment: in.Environment, PR: in.PR})
		if err != nil {
			return nil
		}
		stacks, err := tx.Stacks(p.ExecutionID)
		for _, st := range stacks {
			classes[st.Stack] = st.Class
		}
		return err
	})
	for i, sp := range filled.Stacks {
		if sp.Class == "" {
			filled.Stacks[i].Class = cmp.Or(classes[sp.Stack], events.ClassUnclassified)
		}
	}
	return f.Service.GateCheck(ctx, c, &filled)
}

// everyRow is the page of a list of gates, grants or checks with every row of env and pr a test
// makes.
func everyRow(env string, pr int) Page { return Page{Environment: env, PR: pr, Limit: MaxPageLimit} }

// forEachStore runs fn against a fresh service on every store backend.
func forEachStore(t *testing.T, fn func(t *testing.T, f *fixture)) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			p, err := ParsePolicy("policy.hcl", []byte(testPolicy))
			if err != nil {
				t.Fatal(err)
			}
			f := &fixture{Service: New(b.Open(t), p), t: t, now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
			f.Now = func() time.Time { return f.now }
			fn(t, f)
		})
	}
}

func (f *fixture) must(err error) {
	f.t.Helper()
	if err != nil {
		f.t.Fatal(err)
	}
}

// plan records a finalized plan of pr in env whose stacks have the given class and hash h-<stack>.
func (f *fixture) plan(id, env string, pr int, sha string, classes map[string]api.Class) {
	f.t.Helper()
	var stacks []string
	var results []api.StackResult
	for s, c := range classes {
		stacks = append(stacks, s)
		results = append(results, api.StackResult{Stack: s, Status: "succeeded", Class: c, PlanHash: "h-" + s})
	}
	f.now = f.now.Add(time.Second)
	_, err := f.Init(ctx, runner, &api.Init{ExecutionID: id, Environment: env, Op: "plan", PR: pr, SHA: sha, Stacks: stacks})
	f.must(err)
	_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: id, Status: "succeeded", Stacks: results})
	f.must(err)
}

func wantErr(t *testing.T, err, sentinel error, contains string) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("err = %v, want %v", err, sentinel)
	}
	if contains != "" && !strings.Contains(err.Error(), contains) {
		t.Fatalf("err %q does not mention %q", err, contains)
	}
}

func TestInitIdempotentAndUnknownExecution(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		in := &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", PR: 3, Stacks: []string{"a", "b"},
			Reasons: []api.ChangeReason{{Stack: "a", Kind: "watched-file", Detail: "main.tf"}}}
		_, err := f.Init(ctx, runner, in)
		f.must(err)
		again := *in
		again.SHA = "changed"
		_, err = f.Init(ctx, runner, &again)
		f.must(err)
		x, err := f.Execution(ctx, reader, "e1")
		f.must(err)
		if x.Repo != testRepo || x.SHA != "" || len(x.Stacks) != 2 || x.Stacks[0].Status != "pending" || len(x.Stacks[0].Reasons) != 1 {
			t.Fatalf("execution %+v", x)
		}
		_, err = f.Phase(ctx, runner, &api.PhaseEvent{ExecutionID: "nope", Stack: "a", Phase: "init"})
		wantErr(t, err, store.ErrNotFound, "nope")
		_, err = f.LogChunk(ctx, runner, &api.LogChunk{ExecutionID: "nope", Stack: "a", Data: []byte("x")})
		wantErr(t, err, store.ErrNotFound, "")
		_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "nope", Status: "succeeded"})
		wantErr(t, err, store.ErrNotFound, "")
		_, err = f.Init(ctx, runner, &api.Init{ExecutionID: "e2", Environment: "prod", Op: "destroy"})
		wantErr(t, err, store.ErrInvalid, "op")
	})
}

// An Init's started_at is the runner's, unless it is more than MaxStartAge behind or
// MaxStartAhead ahead of the server's clock: then it is the server's (a made-up time would sit
// at the top of the list). One outside 1970 to 2200 is refused
// (TestEventTimesOutOfTheStoresRangeAreRefused).
func TestInitStartedAtFarFromTheServersClock(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		for i, tc := range []struct {
			sent, want time.Time
		}{
			{f.now.Add(-6 * 24 * time.Hour), f.now.Add(-6 * 24 * time.Hour)},
			{f.now.Add(-MaxStartAge), f.now.Add(-MaxStartAge)},
			{f.now.Add(MaxStartAhead), f.now.Add(MaxStartAhead)},
			{f.now.Add(time.Minute).In(time.FixedZone("x", 2*3600)), f.now.Add(time.Minute)},
			{f.now.Add(-MaxStartAge - time.Nanosecond), f.now},
			{f.now.Add(MaxStartAhead + time.Nanosecond), f.now},
			{f.now.Add(6 * 24 * time.Hour), f.now},
			{time.Date(2199, 1, 1, 0, 0, 0, 0, time.UTC), f.now},
			{time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC), f.now},
		} {
			id := fmt.Sprintf("e%d", i)
			_, err := f.Init(ctx, runner, &api.Init{ExecutionID: id, Environment: "prod", Op: "plan", PR: 1, StartedAt: tc.sent})
			f.must(err)
			x, err := f.Execution(ctx, reader, id)
			f.must(err)
			if !x.StartedAt.Equal(tc.want) {
				t.Errorf("sent %v: started_at %v, want %v", tc.sent, x.StartedAt, tc.want)
			}
		}
	})
}

func TestPhasesAndUpdatesHighestSeqWins(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", Stacks: []string{"a"}})
		f.must(err)
		_, err = f.Phase(ctx, runner, &api.PhaseEvent{ExecutionID: "e1", Stack: "a", Phase: "plan", Seq: 20})
		f.must(err)
		_, err = f.Phase(ctx, runner, &api.PhaseEvent{ExecutionID: "e1", Stack: "a", Phase: "init", Seq: 10})
		f.must(err)
		_, err = f.Update(ctx, runner, &api.Update{ExecutionID: "e1", Stack: "a", Seq: 2, Status: "succeeded", Class: "mutating", PlanHash: "new"})
		f.must(err)
		_, err = f.Update(ctx, runner, &api.Update{ExecutionID: "e1", Stack: "a", Seq: 1, Status: "running", PlanHash: "old"})
		f.must(err)
		x, err := f.Execution(ctx, reader, "e1")
		f.must(err)
		st := x.Stacks[0]
		if st.Phase != "plan" || st.Status != "succeeded" || st.PlanHash != "new" || st.Class != "mutating" {
			t.Fatalf("stack %+v", st)
		}
	})
}

// A batch of phases is stored as its events one by one would be (newest seq wins, retries are
// idempotent), and it carries one execution only, within bounds, or is refused whole.
func TestPhasesBatch(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		for _, id := range []string{"e1", "e2"} {
			_, err := f.Init(ctx, runner, &api.Init{ExecutionID: id, Environment: "prod", Op: "plan", Stacks: []string{"a", "b"}})
			f.must(err)
		}
		batch := []api.PhaseEvent{
			{ExecutionID: "e1", Stack: "a", Phase: "init", Seq: 1},
			{ExecutionID: "e1", Stack: "b", Phase: "plan", Seq: 3},
			{ExecutionID: "e1", Stack: "a", Phase: "done", Status: "succeeded", Seq: 4},
			{ExecutionID: "e1", Stack: "b", Phase: "init", Seq: 2},
		}
		_, err := f.Phases(ctx, runner, batch)
		f.must(err)
		_, err = f.Phases(ctx, runner, batch) // a retry
		f.must(err)
		x, err := f.Execution(ctx, reader, "e1")
		f.must(err)
		if a, b := x.Stacks[0], x.Stacks[1]; a.Phase != "done: succeeded" || b.Phase != "plan" || a.Status != "running" {
			t.Fatalf("stacks %+v %+v", a, b)
		}
		_, err = f.Phases(ctx, runner, []api.PhaseEvent{{ExecutionID: "e1", Stack: "a", Phase: "x", Seq: 9}, {ExecutionID: "e2", Stack: "a", Phase: "x", Seq: 9}})
		wantErr(t, err, store.ErrInvalid, "one execution")
		_, err = f.Phases(ctx, runner, nil)
		wantErr(t, err, store.ErrInvalid, "empty")
		_, err = f.Phases(ctx, runner, make([]api.PhaseEvent, MaxPhases+1))
		wantErr(t, err, store.ErrInvalid, "more than")
		_, err = f.Phases(ctx, runner, []api.PhaseEvent{{ExecutionID: "e1", Stack: "a", Phase: "y", Seq: 10}, {ExecutionID: "e1", Stack: "", Phase: "y", Seq: 11}})
		wantErr(t, err, store.ErrInvalid, "stack")
		x, err = f.Execution(ctx, reader, "e1")
		f.must(err)
		if x.Stacks[0].Phase != "done: succeeded" {
			t.Fatalf("a refused batch changed stack a: %+v", x.Stacks[0])
		}
		_, err = f.Phases(ctx, runner, []api.PhaseEvent{{ExecutionID: "nope", Stack: "a", Phase: "init"}})
		wantErr(t, err, store.ErrNotFound, "")
	})
}

func TestLogsDedupGenerationsAndGaps(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", Stacks: []string{"a"}})
		f.must(err)
		post := func(c api.LogChunk) {
			c.ExecutionID, c.Stack = "e1", "a"
			_, err := f.LogChunk(ctx, runner, &c)
			f.must(err)
		}
		post(api.LogChunk{Generation: 0, Offset: 0, Data: []byte("gen zero")})
		post(api.LogChunk{Generation: 1, Offset: 0, Data: []byte("abc")})
		post(api.LogChunk{Generation: 1, Offset: 0, Data: []byte("abc")}) // retry
		post(api.LogChunk{Generation: 1, Offset: 3, Data: []byte("def")})
		post(api.LogChunk{Generation: 1, Offset: 6, GapLength: 4})
		post(api.LogChunk{Generation: 1, Offset: 10, Data: []byte("xyz")})
		post(api.LogChunk{Generation: 1, Offset: 20, Data: []byte("later")}) // bytes 13..20 not received yet

		sl, err := f.LogRead(ctx, reader, "e1", "a", 0, true, 0, 1<<20)
		f.must(err)
		if sl.Generation != 1 || string(sl.Data) != "abcdef" || sl.NextOffset != 6 {
			t.Fatalf("first read %+v %q", sl, sl.Data)
		}
		sl, err = f.LogRead(ctx, reader, "e1", "a", 1, false, sl.NextOffset, 1<<20)
		f.must(err)
		if string(sl.Data) != "xyz" || sl.NextOffset != 13 || len(sl.Gaps) != 1 || sl.Gaps[0].From != 6 || sl.Gaps[0].To != 10 {
			t.Fatalf("read past gap %+v %q", sl, sl.Data)
		}
		sl, err = f.LogRead(ctx, reader, "e1", "a", 1, false, 13, 1<<20)
		f.must(err)
		if len(sl.Data) != 0 || sl.NextOffset != 13 {
			t.Fatalf("read at hole %+v", sl)
		}
		sl, err = f.LogRead(ctx, reader, "e1", "a", 1, false, 1, 2)
		f.must(err)
		if string(sl.Data) != "bc" || sl.NextOffset != 3 {
			t.Fatalf("bounded read %+v %q", sl, sl.Data)
		}
		sl, err = f.LogRead(ctx, reader, "e1", "a", 0, false, 0, 100)
		f.must(err)
		if string(sl.Data) != "gen zero" {
			t.Fatalf("generation 0 %q", sl.Data)
		}
		x, err := f.Execution(ctx, reader, "e1")
		f.must(err)
		if st := x.Stacks[0]; st.LogGeneration != 1 || st.LogBytes != 25 || len(st.Gaps) != 1 {
			t.Fatalf("stack log summary %+v", st)
		}
		_, err = f.LogChunk(ctx, runner, &api.LogChunk{ExecutionID: "e1", Stack: "a", Data: []byte("x"), GapLength: 3})
		wantErr(t, err, store.ErrInvalid, "not both")
	})
}

func TestFinalizeFirstWinsClaimsGatesAndCheck(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.plan("p1", "prod", 1, "s1", map[string]api.Class{"a": "destructive", "b": "no-changes", "c": "additive"})
		// A second finalize does not change anything.
		_, err := f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "p1", Status: "failed"})
		f.must(err)
		x, err := f.Execution(ctx, reader, "p1")
		f.must(err)
		if x.Status != "succeeded" || x.Class != "destructive" {
			t.Fatalf("execution %+v", x)
		}
		claims, err := f.Claims(ctx, reader, "", "prod")
		f.must(err)
		if len(claims) != 2 || claims[0].Stack != "a" || claims[1].Stack != "c" || claims[0].PR != 1 {
			t.Fatalf("claims %+v", claims)
		}
		if !claims[0].ExpiresAt.Equal(f.now.Add(24 * time.Hour)) {
			t.Errorf("claim expiry %v", claims[0].ExpiresAt)
		}
		gates, err := f.Gates(ctx, reader, everyRow("prod", 1), "")
		f.must(err)
		if len(gates) != 1 || gates[0].Class != "destructive" || gates[0].Target != "**" || gates[0].Satisfied || fmt.Sprint(gates[0].Stacks) != "[a]" {
			t.Fatalf("gates %+v", gates)
		}
		checks, err := f.Checks(ctx, reader, everyRow("prod", 1), "")
		f.must(err)
		if len(checks) != 1 || checks[0].Conclusion != "success" || checks[0].Check != "tfstackplan/plan" {
			t.Fatalf("checks %+v", checks)
		}
		// A newer plan without changes to c releases PR 1's claim on c.
		f.plan("p2", "prod", 1, "s2", map[string]api.Class{"a": "destructive", "c": "no-changes"})
		claims, _ = f.Claims(ctx, reader, "", "prod")
		if len(claims) != 1 || claims[0].Stack != "a" || claims[0].ExecutionID != "p2" {
			t.Fatalf("claims after replan %+v", claims)
		}
	})
}

func TestGateCheckVerdicts(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		check := func(id string, pr int, sha string, stacks ...string) (api.GateLease, error) {
			var sp []api.StackPlan
			for _, s := range stacks {
				h := "h-" + s
				if strings.HasSuffix(s, "!") {
					s, h = strings.TrimSuffix(s, "!"), "tampered"
				}
				sp = append(sp, api.StackPlan{Stack: s, PlanHash: h})
			}
			return f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: id, Environment: "prod", PR: pr, SHA: sha, Stacks: sp})
		}
		_, err := check("ap0", 1, "s1", "a")
		wantErr(t, err, store.ErrPrecondition, "no plan")

		_, err = f.Init(ctx, runner, &api.Init{ExecutionID: "running", Environment: "prod", Op: "plan", PR: 1, SHA: "s1", Stacks: []string{"a"}})
		f.must(err)
		_, err = check("ap0", 1, "s1", "a")
		wantErr(t, err, store.ErrPrecondition, "not finalized")

		f.plan("p1", "prod", 1, "s1", map[string]api.Class{"a": "destructive", "m": "mutating", "n": "no-changes"})
		_, err = check("ap1", 1, "s1", "a!", "m")
		wantErr(t, err, store.ErrDenied, `with a plan hash that differs from the plan's (stale plan): "a"`)
		_, err = check("ap1", 1, "s1", "a", "m", "zzz")
		wantErr(t, err, store.ErrDenied, `named but not changed in the plan: "zzz"`)
		_, err = check("ap1", 1, "s1", "a", "m", "n")
		wantErr(t, err, store.ErrDenied, `named but not changed in the plan: "n"`)
		_, err = check("ap1", 1, "s1", "a", "m")
		wantErr(t, err, store.ErrDenied, "destructive on **")
		// Leaving the gated stack out of the request does not pass: the gate is decided over
		// the plan, not over what the runner lists.
		_, err = check("ap-m", 1, "s1", "m")
		wantErr(t, err, store.ErrDenied, `changed in the plan but not named: "a"`)
		// After a merge the commit differs from the plan's: the content decides, the sha is
		// recorded.
		f.plan("p-dev", "dev", 1, "s1", map[string]api.Class{"m": "mutating"})
		lease, err := f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "ap-dev", Environment: "dev", PR: 1, SHA: "merge-sha",
			Stacks: []api.StackPlan{{Stack: "m", PlanHash: "h-m"}}})
		f.must(err)
		if lease.Requester != "dev-deployer@proj.iam.gserviceaccount.com" || !lease.ExpiresAt.Equal(f.now.Add(2*time.Hour)) {
			t.Fatalf("lease %+v", lease)
		}

		err = f.satisfy(who("alice"), &api.GatesSatisfy{PR: 1, Environment: "prod", Class: "destructive", Target: "**", Reason: "reviewed"})
		f.must(err)
		err = f.satisfy(who("alice"), &api.GatesSatisfy{PR: 1, Environment: "prod", Class: "destructive", Target: "**", Reason: "reviewed"})
		f.must(err)
		grants, _ := f.Grants(ctx, reader, everyRow("prod", 1), 0)
		if len(grants) != 1 || grants[0].Principal != "alice" {
			t.Fatalf("grants after two satisfies %+v", grants)
		}
		lease, err = check("ap1", 1, "s1", "a", "m")
		f.must(err)
		if lease.Requester != "deployer@proj.iam.gserviceaccount.com" || !lease.ExpiresAt.Equal(f.now.Add(time.Hour)) {
			t.Fatalf("lease %+v", lease)
		}
		f.now = f.now.Add(time.Minute)
		again, err := check("ap1", 1, "s1", "a", "m")
		f.must(err)
		// A repeat keeps the lease's end (issue 37: a re-check never extends it).
		if again.Requester != lease.Requester || !again.ExpiresAt.Equal(lease.ExpiresAt) {
			t.Fatalf("repeat lease %+v, first %+v", again, lease)
		}

		// Another PR's apply on a claimed stack names the holder.
		f.plan("p9", "prod", 9, "s9", map[string]api.Class{"a": "mutating"})
		_, err = f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "ap9", Environment: "prod", PR: 9, SHA: "s9",
			Stacks: []api.StackPlan{{Stack: "a", PlanHash: "h-a"}}})
		wantErr(t, err, store.ErrDenied, "claimed by PR #1")

		// Revoking with success releases PR 1's claims; revoked leases are not reused.
		_, err = f.GateRevoke(ctx, who("runner"), &api.GateRevoke{ExecutionID: "ap1", Outcome: "succeeded"})
		f.must(err)
		_, err = f.GateRevoke(ctx, who("runner"), &api.GateRevoke{ExecutionID: "ap1", Outcome: "succeeded"})
		f.must(err)
		claims, _ := f.Claims(ctx, reader, "", "prod")
		for _, c := range claims {
			if c.PR == 1 {
				t.Fatalf("PR 1 still claims %+v", c)
			}
		}
		_, err = check("ap1", 1, "s1", "a", "m")
		wantErr(t, err, store.ErrDenied, "revoked")

		// The revoke ended the grant: the next apply needs a fresh one.
		grants, _ = f.Grants(ctx, reader, everyRow("prod", 1), 0)
		if len(grants) != 1 || grants[0].ReleasedAt.IsZero() || grants[0].ReleasedBy != "runner" {
			t.Fatalf("grant after revoke %+v", grants)
		}
		_, err = check("ap2", 1, "s1", "a", "m")
		wantErr(t, err, store.ErrDenied, "no active grant")
		// Releasing a grant by hand denies again.
		err = f.satisfy(who("alice"), &api.GatesSatisfy{PR: 1, Environment: "prod", Class: "destructive", Target: "**", Reason: "again"})
		f.must(err)
		_, err = f.ReleaseGrant(ctx, who("alice"), &api.GrantsRelease{PR: 1, Environment: "prod", Class: "destructive", Target: "**", Reason: "oops"})
		f.must(err)
		_, err = check("ap3", 1, "s1", "a", "m")
		wantErr(t, err, store.ErrDenied, "no active grant")

		entries, err := f.Audit(ctx, reader, "", 100, 0)
		f.must(err)
		var allowed, denied, admin int
		for _, e := range entries {
			switch {
			case e.Action == "gate.check" && e.Outcome == "allowed":
				allowed++
			case e.Action == "gate.check" && e.Outcome == "denied":
				denied++
			case e.Action == "gates.satisfy" || e.Action == "grants.release":
				admin++
				if e.Principal != "alice" || e.Reason == "" {
					t.Errorf("admin audit entry %+v", e)
				}
			}
		}
		if allowed != 3 || denied < 9 || admin != 3 {
			t.Fatalf("audit: %d allowed, %d denied, %d admin entries: %+v", allowed, denied, admin, entries)
		}
	})
}

func TestGateFollowsThePlanBeingApplied(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.plan("p1", "prod", 1, "s1", map[string]api.Class{"a": "destructive"})
		// A later plan of another commit without changes must not un-gate the first commit.
		f.plan("p2", "prod", 1, "s2", map[string]api.Class{"a": "no-changes"})
		_, err := f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "ap", Environment: "prod", PR: 1, SHA: "s1",
			Stacks: []api.StackPlan{{Stack: "a", PlanHash: "h-a"}}})
		wantErr(t, err, store.ErrDenied, `does not match plan p2: stacks named but not changed in the plan: "a"`)
	})
}

func TestClaimsExpireAndRelease(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.plan("p1", "prod", 1, "s1", map[string]api.Class{"a": "additive", "b": "additive"})
		f.plan("p2", "prod", 2, "s2", map[string]api.Class{"a": "additive"})
		claims, _ := f.Claims(ctx, reader, "", "prod")
		if len(claims) != 2 || claims[0].PR != 1 {
			t.Fatalf("claims %+v", claims)
		}
		_, err := f.ReleaseClaims(ctx, adminOf("bob"), &api.ClaimsRelease{Environment: "prod", PR: 1, Stack: "b", Reason: "stale"})
		f.must(err)
		claims, _ = f.Claims(ctx, reader, "", "prod")
		if len(claims) != 1 || claims[0].Stack != "a" {
			t.Fatalf("after one-stack release %+v", claims)
		}
		f.now = f.now.Add(25 * time.Hour)
		claims, _ = f.Claims(ctx, reader, "", "prod")
		if len(claims) != 0 {
			t.Fatalf("expired claims still listed %+v", claims)
		}
		// PR 2's replan can now claim a.
		f.plan("p3", "prod", 2, "s3", map[string]api.Class{"a": "additive"})
		_, err = f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "ap", Environment: "prod", PR: 2, SHA: "s3",
			Stacks: []api.StackPlan{{Stack: "a", PlanHash: "h-a"}}})
		f.must(err)
	})
}

func TestChecksOverrideAndCancel(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "dev", Op: "plan", PR: 4, Stacks: []string{"a"}})
		f.must(err)
		ack, err := f.CancelExecution(ctx, who("admin"), &api.ExecutionsCancel{ExecutionID: "e1", Reason: "wrong branch"})
		f.must(err)
		if !ack.Cancel {
			t.Fatalf("cancel ack %+v", ack)
		}
		ack, err = f.LogChunk(ctx, runner, &api.LogChunk{ExecutionID: "e1", Stack: "a", Data: []byte("still stored")})
		f.must(err)
		if !ack.Cancel || ack.Reason != "wrong branch" {
			t.Fatalf("event ack after cancel %+v", ack)
		}
		sl, err := f.LogRead(ctx, reader, "e1", "a", 0, true, 0, 100)
		f.must(err)
		if string(sl.Data) != "still stored" {
			t.Fatalf("event after cancel not stored: %q", sl.Data)
		}
		_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "e1", Status: "cancelled"})
		f.must(err)
		checks, _ := f.Checks(ctx, reader, everyRow("dev", 4), "")
		if len(checks) != 1 || checks[0].Conclusion != "cancelled" {
			t.Fatalf("checks %+v", checks)
		}
		_, err = f.OverrideCheck(ctx, who("admin"), &api.ChecksOverride{PR: 4, Environment: "dev", Check: "tfstackplan/plan", Conclusion: "success", Reason: "flaky runner"})
		f.must(err)
		_, err = f.OverrideCheck(ctx, who("admin"), &api.ChecksOverride{PR: 4, Environment: "dev", Check: "tfstackplan/plan", Conclusion: "success", Reason: "flaky runner"})
		f.must(err)
		checks, _ = f.Checks(ctx, reader, everyRow("dev", 4), "")
		if len(checks) != 1 || checks[0].Conclusion != "success" || !checks[0].Overridden || checks[0].Reason != "flaky runner" {
			t.Fatalf("overridden checks %+v", checks)
		}
		entries, _ := f.Audit(ctx, reader, "", 100, 0)
		if len(entries) != 2 || entries[0].Action != "checks.override" || entries[1].Action != "executions.cancel" {
			t.Fatalf("audit %+v", entries)
		}
		_, err = f.CancelExecution(ctx, who("admin"), &api.ExecutionsCancel{ExecutionID: "nope", Reason: "x"})
		wantErr(t, err, store.ErrNotFound, "")
		_, err = f.OverrideCheck(ctx, who("admin"), &api.ChecksOverride{PR: 4, Environment: "dev", Check: "c", Conclusion: "success", Reason: " "})
		wantErr(t, err, store.ErrInvalid, "reason")
	})
}

func TestGrantExpiry(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.plan("p1", "prod", 1, "s1", map[string]api.Class{"a": "destructive"})
		err := f.satisfy(who("alice"), &api.GatesSatisfy{PR: 1, Environment: "prod", Class: "destructive", Target: "**",
			Reason: "ok for ten minutes", ExpiresAt: f.now.Add(10 * time.Minute)})
		f.must(err)
		gates, _ := f.Gates(ctx, reader, everyRow("prod", 1), "")
		if len(gates) != 1 || !gates[0].Satisfied {
			t.Fatalf("gates %+v", gates)
		}
		f.now = f.now.Add(11 * time.Minute)
		_, err = f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "ap", Environment: "prod", PR: 1, SHA: "s1",
			Stacks: []api.StackPlan{{Stack: "a", PlanHash: "h-a"}}})
		wantErr(t, err, store.ErrDenied, "no active grant")
		err = f.satisfy(who("alice"), &api.GatesSatisfy{PR: 1, Environment: "prod", Class: "destructive", Target: "**",
			Reason: "late", ExpiresAt: f.now.Add(-time.Minute)})
		wantErr(t, err, store.ErrInvalid, "in the past")
	})
}

func TestConcurrentDecisionsStayConsistent(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		// Two PRs finalize plans touching the same stack at once: exactly one holds the claim.
		for _, pr := range []int{1, 2} {
			_, err := f.Init(ctx, runner, &api.Init{ExecutionID: fmt.Sprint("p", pr), Environment: "prod", Op: "plan", PR: pr, SHA: "s", Stacks: []string{"a"}})
			f.must(err)
		}
		var wg sync.WaitGroup
		for _, pr := range []int{1, 2} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := f.Finalize(ctx, runner, &api.Finalize{ExecutionID: fmt.Sprint("p", pr), Status: "succeeded",
					Stacks: []api.StackResult{{Stack: "a", Status: "succeeded", Class: "additive", PlanHash: "h-a"}}})
				if err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		claims, _ := f.Claims(ctx, reader, "", "prod")
		if len(claims) != 1 {
			t.Fatalf("claims %+v", claims)
		}
		holder := claims[0].PR
		// Both PRs check their gates concurrently, many times: only the holder is ever allowed,
		// and repeats of one execution id share one lease.
		results := make(chan string, 40)
		for i := 0; i < 20; i++ {
			for _, pr := range []int{1, 2} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					l, err := f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: fmt.Sprint("apply-", pr), Environment: "prod", PR: pr, SHA: "s",
						Stacks: []api.StackPlan{{Stack: "a", PlanHash: "h-a"}}})
					switch {
					case err == nil:
						results <- fmt.Sprintf("allowed %d %s", pr, l.ExpiresAt)
					case errors.Is(err, store.ErrDenied):
						results <- fmt.Sprintf("denied %d", pr)
					default:
						results <- "error " + err.Error()
					}
				}()
			}
		}
		wg.Wait()
		close(results)
		seen := map[string]int{}
		for r := range results {
			seen[r]++
		}
		if len(seen) != 2 || seen[fmt.Sprintf("denied %d", 3-holder)] != 20 {
			t.Fatalf("outcomes %v (holder PR %d)", seen, holder)
		}
	})
}

func TestStoreFailureIsUnavailable(t *testing.T) {
	s := storetest.OpenSQLite(t)
	svc := New(s, nil)
	_ = s.Close()
	_, err := svc.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "x", Environment: "prod", PR: 1, SHA: "s",
		Stacks: []api.StackPlan{{Stack: "a", PlanHash: "h", Class: "mutating"}}})
	wantErr(t, err, store.ErrUnavailable, "")
}

func TestPolicyParsing(t *testing.T) {
	bad := map[string]string{
		"environment \"p\" {\n gate {\n classes = [\"scary\"]\n stacks = [\"**\"]\n }\n}":        "unknown class",
		"environment \"p\" {\n gate {\n classes = [\"destructive\"]\n stacks = [\"a**\"]\n }\n}": "whole path segment",
		`claim_ttl = "soon"`: "positive duration",
		`environment "p" {}
environment "p" {}`: "defined twice",
		`bogus = 1`:          "bogus",
		`granter "vault" {}`: `granter "vault" is not "none" or "gcp-iam"`,
		"granter \"none\" {}\ngranter \"none\" {}":                              "at most one",
		"granter \"gcp-iam\" {}\nenvironment \"p\" {\n requester = \"sa@x\"\n}": "needs runner_member",
	}
	for src, want := range bad {
		if _, err := ParsePolicy("p.hcl", []byte(src)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("policy %q: err %v, want mention of %q", src, err, want)
		}
	}
	p, err := ParsePolicy("p.hcl", []byte(`granter "gcp-iam" {
  endpoint = "http://127.0.0.1:9/"
}
environment "p" {
  requester     = "sa@x"
  runner_member = "serviceAccount:ci@x"
}`))
	if err != nil || p.Granter != "gcp-iam" || p.GranterConfig.Endpoint != "http://127.0.0.1:9/" || p.Environments["p"].RunnerMember != "serviceAccount:ci@x" {
		t.Errorf("granter policy %+v %v", p, err)
	}
	for glob, cases := range map[string]map[string]bool{
		"**":        {"a": true, "a/b/c": true},
		"prod/**":   {"prod": true, "prod/x/y": true, "dev/x": false},
		"prod/*/db": {"prod/eu/db": true, "prod/eu/x/db": false},
		"a?c":       {"abc": true, "ac": false},
	} {
		for name, want := range cases {
			if got := MatchGlob(glob, name); got != want {
				t.Errorf("MatchGlob(%q, %q) = %v, want %v", glob, name, got, want)
			}
		}
	}
}

func TestLogChunksBatch(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", Stacks: []string{"a", "b"}})
		f.must(err)
		batch := []api.LogChunk{
			{ExecutionID: "e1", Stack: "a", Generation: 1, Offset: 0, Data: []byte("a0 ")},
			{ExecutionID: "e1", Stack: "b", Generation: 1, Offset: 0, Data: []byte("b0 ")},
			{ExecutionID: "e1", Stack: "a", Generation: 1, Offset: 3, Data: []byte("a1 ")},
			{ExecutionID: "e1", Stack: "a", Generation: 1, Offset: 3, Data: []byte("aXX")}, // the same key, other bytes
		}
		_, err = f.LogChunks(ctx, runner, batch)
		wantErr(t, err, store.ErrMismatch, "at offset 3 (3 bytes) differs at offset 4 from another chunk of the batch")
		if sl, _ := f.LogRead(ctx, reader, "e1", "b", 0, true, 0, 100); len(sl.Data) != 0 {
			t.Fatalf("a refused batch stored %q", sl.Data)
		}
		batch[3].Data = []byte("a1 ") // a duplicate: stored once
		_, err = f.LogChunks(ctx, runner, batch)
		f.must(err)
		_, err = f.LogChunks(ctx, runner, batch) // a retry of the whole batch
		f.must(err)
		for stack, want := range map[string]string{"a": "a0 a1 ", "b": "b0 "} {
			sl, err := f.LogRead(ctx, reader, "e1", stack, 0, true, 0, 100)
			f.must(err)
			if string(sl.Data) != want {
				t.Errorf("stack %s: %q, want %q", stack, sl.Data, want)
			}
		}
		// A batch with one bad chunk stores nothing.
		_, err = f.LogChunks(ctx, runner, []api.LogChunk{
			{ExecutionID: "e1", Stack: "a", Generation: 1, Offset: 6, Data: []byte("a2 ")},
			{ExecutionID: "e1", Stack: "a", Generation: 1, Offset: -1, Data: []byte("bad")},
		})
		wantErr(t, err, store.ErrInvalid, "negative")
		_, err = f.LogChunks(ctx, runner, []api.LogChunk{
			{ExecutionID: "e1", Stack: "a", Generation: 1, Offset: 6, Data: []byte("a2 ")},
			{ExecutionID: "other", Stack: "a", Generation: 1, Offset: 0, Data: []byte("x")},
		})
		wantErr(t, err, store.ErrInvalid, "one execution")
		_, err = f.LogChunks(ctx, runner, []api.LogChunk{{ExecutionID: "missing", Stack: "a", Generation: 1, Data: []byte("x")}})
		wantErr(t, err, store.ErrNotFound, "")
		sl, _ := f.LogRead(ctx, reader, "e1", "a", 0, true, 0, 100)
		if string(sl.Data) != "a0 a1 " {
			t.Fatalf("rejected batch stored something: %q", sl.Data)
		}
	})
}

// runner is the caller of the tests' runner events: the principal their executions are
// announced by.
var runner = who("runner")

// testRepo is the repository of the tests' executions: every test caller is limited to it, so a
// request that names no repository means it.
const testRepo = "acme/infra"

// who is a caller limited to testRepo; adminOf one with the admin role too; reader reads.
func who(name string) Caller { return Caller{Name: name, Repositories: []string{testRepo}} }

func adminOf(name string) Caller { c := who(name); c.Admin = true; return c }

var reader = who("viewer")

// An execution announced without a principal is an admin's alone; a cached owner answers as
// the store would, for every caller.
func TestEventsOfAnExecutionWithoutPrincipal(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, who(""), &api.Init{ExecutionID: "anon", Environment: "prod", Op: "plan", Stacks: []string{"a"}})
		f.must(err)
		for range 2 { // the second time from the owners cache
			_, err = f.Phase(ctx, Caller{}, &api.PhaseEvent{ExecutionID: "anon", Stack: "a", Phase: "plan"})
			wantErr(t, err, store.ErrDenied, "not announced by")
			_, err = f.Phase(ctx, runner, &api.PhaseEvent{ExecutionID: "anon", Stack: "a", Phase: "plan"})
			wantErr(t, err, store.ErrDenied, "not announced by runner")
			_, err = f.Phase(ctx, adminOf("alice"), &api.PhaseEvent{ExecutionID: "anon", Stack: "a", Phase: "plan"})
			f.must(err)
		}
		_, err = f.Phase(ctx, adminOf("alice"), &api.PhaseEvent{ExecutionID: "unknown", Stack: "a", Phase: "plan"})
		wantErr(t, err, store.ErrNotFound, "unknown")
	})
}

// Finalize writes only the stacks it changes: a stack whose update already said what the
// finalize says keeps its update time, the others take the finalize's, and a stack the
// execution never announced is added in name order.
func TestFinalizeWritesOnlyChangedStacks(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e", Environment: "prod", Op: "plan", Stacks: []string{"b", "d"}})
		f.must(err)
		updated := f.now
		_, err = f.Update(ctx, runner, &api.Update{ExecutionID: "e", Stack: "b", Seq: 1, Status: "succeeded", Class: "additive",
			Counts: api.Counts{Create: 1}, PlanHash: "v1:b"})
		f.must(err)
		f.now = f.now.Add(time.Minute)
		_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "e", Status: "succeeded", Stacks: []api.StackResult{
			{Stack: "b", Status: "succeeded", Class: "additive", Counts: api.Counts{Create: 1}, PlanHash: "v1:b"},
			{Stack: "d", Status: "succeeded", Class: "no-changes", PlanHash: "v1:d"},
			{Stack: "a", Status: "succeeded", Class: "no-changes", PlanHash: "v1:a"},
		}})
		f.must(err)
		e, err := f.Execution(ctx, reader, "e")
		f.must(err)
		if e.Status != "succeeded" || len(e.Stacks) != 3 {
			t.Fatalf("execution %+v", e)
		}
		want := map[string]time.Time{"a": f.now, "b": updated, "d": f.now}
		for i, st := range e.Stacks {
			if name := []string{"a", "b", "d"}[i]; st.Stack != name {
				t.Errorf("stack %d is %q, want %q", i, st.Stack, name)
			}
			if !st.UpdatedAt.Equal(want[st.Stack]) || st.Status != "succeeded" || st.PlanHash != "v1:"+st.Stack {
				t.Errorf("stack %s: %+v, want updated at %v", st.Stack, st, want[st.Stack])
			}
		}
	})
}

// What one execution may carry is bounded, and a stack named twice in one request is refused
// before anything is stored: each copy would be stored and re-encoded with all of the stack's
// reasons (a 100 KB Init of one stack repeated 4,000 times took 4 s and 800 MB).
func TestRequestsBoundTheirStacks(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		many := make([]string, MaxStacks+1)
		for i := range many {
			many[i] = fmt.Sprint("s", i)
		}
		for _, c := range []struct {
			name string
			in   api.Init
			want string
		}{
			{"a stack twice", api.Init{Stacks: []string{"a", "b", "a"}}, `stack "a" is named twice`},
			{"too many stacks", api.Init{Stacks: many}, fmt.Sprint("more than ", MaxStacks)},
			{"too many edges", api.Init{Stacks: []string{"a", "b"}, Edges: make([]api.Edge, MaxEdges+1)}, fmt.Sprint("more than ", MaxEdges)},
		} {
			c.in.ExecutionID, c.in.Environment, c.in.Op = "refused", "prod", "plan"
			_, err := f.Init(ctx, runner, &c.in)
			wantErr(t, err, store.ErrInvalid, c.want)
		}
		if _, err := f.Execution(ctx, reader, "refused"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a refused Init stored its execution: %v", err)
		}
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", Stacks: many[:MaxStacks]})
		f.must(err)
		_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "e1", Status: events.ExecutionFailed,
			Stacks: []api.StackResult{{Stack: "s1", Status: events.StackSucceeded}, {Stack: "s1", Status: events.StackFailed}}})
		wantErr(t, err, store.ErrInvalid, `stack "s1" is named twice`)
		x, err := f.Execution(ctx, reader, "e1")
		f.must(err)
		if x.Status != events.ExecutionRunning || len(x.Stacks) != MaxStacks {
			t.Fatalf("a refused Finalize changed the execution: %s, %d stacks", x.Status, len(x.Stacks))
		}
		_, err = f.LogChunks(ctx, runner, make([]api.LogChunk, MaxChunks+1))
		wantErr(t, err, store.ErrInvalid, fmt.Sprint("more than ", MaxChunks))
		_, err = f.Audit(ctx, reader, "", 10, -1)
		wantErr(t, err, store.ErrInvalid, "before -1 is negative")
	})
}
