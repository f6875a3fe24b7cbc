package service

import (
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Regression tests for the ways the gate could be passed, each on every store.

// planWith records a finalized plan whose stacks have the given classes and hashes.
func (f *fixture) planWith(id string, pr int, sha string, stacks map[string][2]string) {
	f.t.Helper()
	var names []string
	var results []api.StackResult
	for name, ch := range stacks {
		names = append(names, name)
		results = append(results, api.StackResult{Stack: name, Status: "succeeded", Class: api.Class(ch[0]), PlanHash: ch[1]})
	}
	f.now = f.now.Add(time.Second)
	_, err := f.Init(ctx, runner, &api.Init{ExecutionID: id, Environment: "prod", Op: "plan", PR: pr, SHA: sha, Stacks: names})
	f.must(err)
	_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: id, Status: "succeeded", Stacks: results})
	f.must(err)
}

func (f *fixture) check(id string, pr int, stacks ...api.StackPlan) (api.GateLease, error) {
	return f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: id, Environment: "prod", PR: pr, SHA: "head", Stacks: stacks})
}

func (f *fixture) approve(pr int, plan string) error {
	return f.satisfy(who("alice"), &api.GatesSatisfy{PR: pr, Environment: "prod", Class: "destructive", Target: "**",
		Reason: "reviewed", ExecutionID: plan})
}

// satisfy is SatisfyGate of the plan in names, or of the PR's latest plan (as `admin gates
// satisfy --latest` would look it up) when it names none.
func (f *fixture) satisfy(c Caller, in *api.GatesSatisfy) error {
	f.t.Helper()
	if in.ExecutionID == "" {
		_ = f.Store.Read(ctx, func(tx store.Tx) error {
			p, err := tx.LatestPlan(store.PRKey{Repo: testRepo, Environment: in.Environment, PR: in.PR})
			if err == nil {
				in.ExecutionID = p.ExecutionID
			}
			return nil
		})
	}
	_, err := f.SatisfyGate(ctx, c, in)
	return err
}

func sp(stack, hash string) api.StackPlan { return api.StackPlan{Stack: stack, PlanHash: hash} }

func TestGateIsDecidedOverThePlanNotTheRequest(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.planWith("p1", 1, "s1", map[string][2]string{"m": {"mutating", "v1:m"}, "d": {"destructive", "v1:d"}})
		// No grant: naming only the mutating stack used to pass with a lease.
		_, err := f.check("ap1", 1, sp("m", "v1:m"))
		wantErr(t, err, store.ErrDenied, `changed in the plan but not named: "d"`)
		_, err = f.check("ap2", 1, sp("m", "v1:m"), sp("d", "v1:d"), sp("x", "v1:x"))
		wantErr(t, err, store.ErrDenied, `named but not changed in the plan: "x"`)
		_, err = f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "ap3", Environment: "prod", PR: 1, SHA: "head",
			Stacks: []api.StackPlan{sp("m", "v1:m"), sp("m", "v1:m")}})
		wantErr(t, err, store.ErrInvalid, `stack "m" is named twice`)
		_, err = f.check("ap4", 1, sp("m", "v1:m"), sp("d", "v1:d"))
		wantErr(t, err, store.ErrDenied, "no active grant")
		f.must(f.approve(1, ""))
		_, err = f.check("ap4", 1, sp("m", "v1:m"), sp("d", "v1:d"))
		f.must(err)
	})
}

func TestAnApprovalCoversExactlyThePlanContentItApproved(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		err := f.approve(1, "p0")
		wantErr(t, err, store.ErrPrecondition, "has no plan to approve")
		f.planWith("p1", 1, "s1", map[string][2]string{"d": {"destructive", "v1:old"}, "m": {"mutating", "v1:m"}})
		f.planWith("other", 2, "s1", map[string][2]string{"d": {"destructive", "v1:old"}})
		wantErr(t, f.approve(1, "other"), store.ErrStale, "is not the latest plan of acme/infra prod PR #1: plan p1")
		f.must(f.approve(1, "p1"))
		f.must(f.approve(1, "p1")) // the same content is not approved twice
		grants, _ := f.Grants(ctx, reader, everyRow("prod", 1), 0)
		if len(grants) != 1 || grants[0].ExecutionID != "p1" || len(grants[0].Stacks) != 1 || grants[0].Stacks[0] != sp("d", "v1:old") {
			t.Fatalf("grants %+v", grants)
		}
		// A later plan of the PR with other destructive content needs a new approval.
		f.planWith("p2", 1, "s2", map[string][2]string{"d": {"destructive", "v1:new"}, "m": {"mutating", "v1:m"}})
		gates, _ := f.Gates(ctx, reader, everyRow("prod", 1), "")
		if len(gates) != 1 || gates[0].Satisfied {
			t.Fatalf("gates after a new plan %+v", gates)
		}
		_, err = f.check("ap1", 1, sp("d", "v1:new"), sp("m", "v1:m"))
		wantErr(t, err, store.ErrDenied, `approved plan p1, whose content differs on stack "d"`)
		// A re-plan with the approved content (another commit, e.g. after a rebase) still passes:
		// the approval is of content, not of a commit.
		f.planWith("p3", 1, "s3", map[string][2]string{"d": {"destructive", "v1:old"}, "m": {"mutating", "v1:other"}})
		if gates, _ := f.Gates(ctx, reader, everyRow("prod", 1), ""); len(gates) != 1 || !gates[0].Satisfied {
			t.Fatalf("gates after a re-plan with the approved content %+v", gates)
		}
		_, err = f.check("ap2", 1, sp("d", "v1:old"), sp("m", "v1:other"))
		f.must(err)
	})
}

func TestEveryGateCheckDecidesAfresh(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.planWith("p1", 1, "s1", map[string][2]string{"d": {"destructive", "v1:d"}})
		f.must(f.approve(1, ""))
		_, err := f.check("ap1", 1, sp("d", "v1:d"))
		f.must(err)
		// The grant is released: the same execution's repeat is denied, not served from a cache.
		_, err = f.ReleaseGrant(ctx, who("alice"), &api.GrantsRelease{PR: 1, Environment: "prod", Class: "destructive", Target: "**", Reason: "withdrawn"})
		f.must(err)
		_, err = f.check("ap1", 1, sp("d", "v1:d"))
		wantErr(t, err, store.ErrDenied, "no active grant")

		f.must(f.approve(1, ""))
		_, err = f.check("ap2", 1, sp("d", "v1:d"))
		f.must(err)
		// Other stacks than the plan's: denied.
		_, err = f.check("ap2", 1, sp("zz", "v1:zz"))
		wantErr(t, err, store.ErrDenied, "does not match plan p1")

		f.must(f.approve(1, ""))
		_, err = f.check("ap3", 1, sp("d", "v1:d"))
		f.must(err)
		// The plan is cancelled: denied.
		_, err = f.CancelExecution(ctx, who("admin"), &api.ExecutionsCancel{ExecutionID: "p1", Reason: "bad plan"})
		f.must(err)
		_, err = f.check("ap3", 1, sp("d", "v1:d"))
		wantErr(t, err, store.ErrPrecondition, "was cancelled")
	})
}

func TestTheLatestPlanIsTheOneTheServerReceivedLast(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.planWith("old", 1, "s1", map[string][2]string{"m": {"mutating", "v1:m"}})
		// A newer plan, backdated by its client, then cancelled: it is still the latest, so the
		// older plan does not pass in its place.
		f.now = f.now.Add(time.Minute)
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "new", Environment: "prod", Op: "plan", PR: 1, SHA: "s2",
			Stacks: []string{"m"}, StartedAt: f.now.Add(-24 * time.Hour)})
		f.must(err)
		_, err = f.CancelExecution(ctx, who("admin"), &api.ExecutionsCancel{ExecutionID: "new", Reason: "stop"})
		f.must(err)
		_, err = f.check("ap", 1, sp("m", "v1:m"))
		wantErr(t, err, store.ErrPrecondition, "plan new of acme/infra prod PR #1 was cancelled")
	})
}

func TestAPlanWithAStackThatDidNotSucceedIsNotApplicable(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		cases := []struct {
			name, want string
			update     *api.Update
			result     *api.StackResult
		}{
			{"failed-then-succeeded-finalize", `stack "b" ended failed`,
				&api.Update{Stack: "b", Seq: 1, Status: "failed"}, nil},
			{"unclassified", `stack "b" is unclassified`,
				nil, &api.StackResult{Stack: "b", Status: "succeeded", Class: "unclassified"}},
			{"never-updated", `stack "b" ended pending`, nil, nil},
			{"skipped", `stack "b" was not planned`, nil, &api.StackResult{Stack: "b", Status: "skipped"}},
		}
		for i, c := range cases {
			pr := 10 + i
			id := "p-" + c.name
			f.now = f.now.Add(time.Second)
			_, err := f.Init(ctx, runner, &api.Init{ExecutionID: id, Environment: "prod", Op: "plan", PR: pr, SHA: "s", Stacks: []string{"a", "b"}})
			f.must(err)
			if c.update != nil {
				u := *c.update
				u.ExecutionID = id
				_, err = f.Update(ctx, runner, &u)
				f.must(err)
			}
			results := []api.StackResult{{Stack: "a", Status: "succeeded", Class: "mutating", PlanHash: "v1:a"}}
			if c.result != nil {
				results = append(results, *c.result)
			}
			_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: id, Status: "succeeded", Stacks: results})
			f.must(err)
			e, err := f.Execution(ctx, reader, id)
			f.must(err)
			if e.Status != "failed" || !strings.Contains(e.Error, c.want) {
				t.Errorf("%s: stored %s %q, want failed mentioning %q", c.name, e.Status, e.Error, c.want)
			}
			_, err = f.check("ap-"+c.name, pr, sp("a", "v1:a"))
			wantErr(t, err, store.ErrPrecondition, "ended failed")
		}
		// An apply whose stacks were skipped (nothing to apply) still succeeds.
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "apply", Environment: "dev", Op: "apply", PR: 1, Stacks: []string{"a", "b"}})
		f.must(err)
		_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "apply", Status: "succeeded", Stacks: []api.StackResult{
			{Stack: "a", Status: "succeeded"}, {Stack: "b", Status: "skipped"}}})
		f.must(err)
		if e, _ := f.Execution(ctx, reader, "apply"); e.Status != "succeeded" {
			t.Fatalf("apply with a skipped stack stored %s: %s", e.Status, e.Error)
		}
	})
}

func TestRunnersEndOnlyWhatTheirOwnExecutionTook(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.planWith("p1", 1, "s1", map[string][2]string{"d": {"destructive", "v1:d"}})
		f.must(f.approve(1, ""))
		// A made-up execution id naming PR 1 ends nothing of PR 1's.
		_, err := f.GateRevoke(ctx, who("runner-of-pr-2"), &api.GateRevoke{ExecutionID: "made-up", Environment: "prod", PR: 1, Outcome: "succeeded"})
		f.must(err)
		if grants, _ := f.Grants(ctx, reader, everyRow("prod", 1), 0); len(grants) != 1 || !grants[0].ReleasedAt.IsZero() {
			t.Fatalf("PR 1's grant after a stranger's revoke %+v", grants)
		}
		if claims, _ := f.Claims(ctx, reader, "", "prod"); len(claims) != 1 {
			t.Fatalf("PR 1's claim after a stranger's revoke %+v", claims)
		}
		// PR 2's runner cannot drop PR 1's claim and then pass the gate.
		f.planWith("p2", 2, "s2", map[string][2]string{"d": {"mutating", "v1:d2"}})
		_, err = f.ReleaseClaims(ctx, who("runner-of-pr-2"), &api.ClaimsRelease{Environment: "prod", PR: 1})
		wantErr(t, err, store.ErrDenied, "admin action")
		_, err = f.ReleaseClaims(ctx, who("runner-of-pr-2"), &api.ClaimsRelease{Environment: "prod", PR: 1, ExecutionID: "p1"})
		wantErr(t, err, store.ErrDenied, "was not announced by runner-of-pr-2")
		_, err = f.check("ap2", 2, sp("d", "v1:d2"))
		wantErr(t, err, store.ErrDenied, "claimed by PR #1")
		// The runner that announced p1 may release p1's claims; an admin may release any.
		_, err = f.ReleaseClaims(ctx, who("runner"), &api.ClaimsRelease{Environment: "prod", PR: 1, ExecutionID: "p1"})
		f.must(err)
		if claims, _ := f.Claims(ctx, reader, "", "prod"); len(claims) != 0 {
			t.Fatalf("claims after the owner's release %+v", claims)
		}
		_, err = f.ReleaseClaims(ctx, adminOf("root"), &api.ClaimsRelease{Environment: "prod", PR: 1})
		wantErr(t, err, store.ErrInvalid, "reason is required")
		f.planWith("p3", 3, "s3", map[string][2]string{"c": {"additive", "v1:c"}})
		_, err = f.ReleaseClaims(ctx, adminOf("root"), &api.ClaimsRelease{Environment: "prod", PR: 3, Reason: "abandoned PR"})
		f.must(err)
		if entries, _ := f.Audit(ctx, reader, "", 1, 0); len(entries) != 1 || entries[0].Action != "claims.release" || entries[0].Reason != "abandoned PR" || entries[0].Principal != "root" {
			t.Fatalf("audit of an admin's release %+v", entries)
		}
	})
}

func TestNegativePRsAndUnboundedFieldsAreRefused(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		base := api.Init{ExecutionID: "e", Environment: "prod", Op: "plan", Stacks: []string{"a"}}
		for _, c := range []struct {
			name, want string
			edit       func(*api.Init)
		}{
			{"negative pr", "pr -1 is negative", func(in *api.Init) { in.PR = -1 }},
			{"huge actor", "actor is longer than 256 bytes", func(in *api.Init) { in.Actor = strings.Repeat("x", 1<<20) }},
			{"huge repo", "repository \"xxxxxx", func(in *api.Init) { in.Repo = strings.Repeat("x", 1<<20) }},
			{"NUL in actor", "actor contains a NUL byte", func(in *api.Init) { in.Actor = "a\x00b" }},
			{"NUL in stack", "control character", func(in *api.Init) { in.Stacks = []string{"a\x00"} }},
			{"NUL in reason", "reason detail contains a NUL byte", func(in *api.Init) {
				in.Reasons = []api.ChangeReason{{Stack: "a", Kind: "other", Detail: "x\x00"}}
			}},
		} {
			in := base
			c.edit(&in)
			_, err := f.Init(ctx, runner, &in)
			if err == nil {
				t.Fatalf("%s: accepted", c.name)
			}
			wantErr(t, err, store.ErrInvalid, c.want)
		}
		_, err := f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "x", Environment: "prod", PR: 1, SHA: "s\x00",
			Stacks: []api.StackPlan{sp("a", "v1:a")}})
		wantErr(t, err, store.ErrInvalid, "sha contains a NUL byte")
		_, err = f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "x", Environment: "prod", PR: 1, SHA: "s",
			Stacks: []api.StackPlan{sp("a", "v1:\x00")}})
		wantErr(t, err, store.ErrInvalid, "plan_hash contains a NUL byte")
		// Free text is repaired, never refused: a runner's error message with a NUL is stored.
		_, err = f.Init(ctx, runner, &base)
		f.must(err)
		_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "e", Status: "failed", Error: "tofu said \x00 and \xff"})
		f.must(err)
		e, err := f.Execution(ctx, reader, "e")
		f.must(err)
		if e.Error != "tofu said \uFFFD and \uFFFD" {
			t.Fatalf("stored error %q", e.Error)
		}
	})
}

// The same text rule for runner events on every store: a NUL in a hash or an address is
// refused (PostgreSQL cannot store it; SQLite must not either), free text is repaired.
func TestRunnerEventsFollowOneTextRule(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e", Environment: "prod", Op: "plan", Stacks: []string{"a"}})
		f.must(err)
		_, err = f.Update(ctx, runner, &api.Update{ExecutionID: "e", Stack: "a", Seq: 1, Status: "succeeded", PlanHash: "v1:\x00"})
		wantErr(t, err, store.ErrInvalid, "plan_hash contains a NUL byte")
		_, err = f.Update(ctx, runner, &api.Update{ExecutionID: "e", Stack: "a", Seq: 1, Status: "succeeded", Destructive: []string{"aws_db.x\x00"}})
		wantErr(t, err, store.ErrInvalid, "destructive address contains a NUL byte")
		_, err = f.Update(ctx, runner, &api.Update{ExecutionID: "e", Stack: "a", Seq: 2, Status: "failed", Error: "boom\x00"})
		f.must(err)
		_, err = f.Phase(ctx, runner, &api.PhaseEvent{ExecutionID: "e", Stack: "a", Phase: "plan", Seq: 3, Status: "ok\x00", Message: "m\x00"})
		f.must(err)
		if st := f.stackState("e", "a"); st.Error != "boom\uFFFD" || st.Phase != "plan: ok\uFFFD" {
			t.Fatalf("stack %+v", st)
		}
	})
}

// An apply announced for another PR, finalized as a success without passing that PR's gate,
// does not free the PR's claims; the apply that passed the gate does.
func TestOnlyAGatedApplyEndsThePRsClaims(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.planWith("p1", 1, "s1", map[string][2]string{"m": {"mutating", "v1:m"}})
		apply := func(id string) {
			t.Helper()
			_, err := f.Init(ctx, runner, &api.Init{ExecutionID: id, Environment: "prod", Op: "apply", PR: 1, Stacks: []string{"m"}})
			f.must(err)
			_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: id, Status: "succeeded",
				Stacks: []api.StackResult{{Stack: "m", Status: "succeeded", Class: "mutating", PlanHash: "v1:m"}}})
			f.must(err)
		}
		apply("forged")
		if claims, _ := f.Claims(ctx, reader, "", "prod"); len(claims) != 1 {
			t.Fatalf("a forged apply freed the claims: %+v", claims)
		}
		_, err := f.check("ap", 1, sp("m", "v1:m"))
		f.must(err)
		apply("ap")
		if claims, _ := f.Claims(ctx, reader, "", "prod"); len(claims) != 0 {
			t.Fatalf("the gated apply left claims %+v", claims)
		}
	})
}

// A plan of the PR announced by another principal, with no changes, does not free the claims
// the PR's own plan took (and so cannot open its stacks to another PR's apply).
func TestAnotherPrincipalsPlanDoesNotFreeThePRsClaims(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.planWith("p1", 1, "s1", map[string][2]string{"m": {"mutating", "v1:m"}})
		_, err := f.Init(ctx, who("runner-of-pr-2"), &api.Init{ExecutionID: "forged", Environment: "prod", Op: "plan", PR: 1, Stacks: []string{"m"}})
		f.must(err)
		_, err = f.Finalize(ctx, who("runner-of-pr-2"), &api.Finalize{ExecutionID: "forged", Status: "succeeded",
			Stacks: []api.StackResult{{Stack: "m", Status: "succeeded", Class: "no-changes"}}})
		f.must(err)
		if claims, _ := f.Claims(ctx, reader, "", "prod"); len(claims) != 1 || claims[0].ExecutionID != "p1" {
			t.Fatalf("claims after another principal's plan %+v", claims)
		}
		f.planWith("p2", 2, "s2", map[string][2]string{"m": {"mutating", "v1:m2"}})
		_, err = f.check("ap2", 2, sp("m", "v1:m2"))
		wantErr(t, err, store.ErrDenied, "claimed by PR #1")
		// The PR's own re-plan without changes frees them.
		f.planWith("p3", 1, "s3", map[string][2]string{"m": {"no-changes", ""}})
		if claims, _ := f.Claims(ctx, reader, "", "prod"); len(claims) != 0 {
			t.Fatalf("claims after the PR's own re-plan %+v", claims)
		}
	})
}

func TestAShardNamesItsOwnStacksAndTheWholePlanIsStillDecided(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.planWith("p1", 1, "s1", map[string][2]string{"m": {"mutating", "v1:m"}, "d": {"destructive", "v1:d"}, "a": {"additive", "v1:a"}})
		shard := func(id, k string, stacks ...api.StackPlan) error {
			_, err := f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: id, Environment: "prod", PR: 1, SHA: "head", Shard: k, Stacks: stacks})
			return err
		}
		// The gate of d is not satisfied: a shard without d is denied all the same.
		wantErr(t, shard("ap", "1/2", sp("m", "v1:m")), store.ErrDenied, "no active grant")
		f.must(f.approve(1, ""))
		f.must(shard("ap", "1/2", sp("m", "v1:m")))
		f.must(shard("ap", "2/2", sp("d", "v1:d"), sp("a", "v1:a")))
		// Without the shard the same request is a plan left out.
		_, err := f.check("ap2", 1, sp("m", "v1:m"))
		wantErr(t, err, store.ErrDenied, `changed in the plan but not named: "a", "d"`)
		// A shard may not name what the plan does not change, nor other content.
		wantErr(t, shard("ap4", "1/2", sp("m", "v1:other")), store.ErrDenied, "differs from the plan's")
		wantErr(t, shard("ap", "1/2", sp("m", "v1:m"), sp("x", "v1:x")), store.ErrDenied, `named but not changed in the plan: "x"`)
		// That denied re-check ended the execution's one lease, for every shard.
		wantErr(t, shard("ap", "2/2", sp("d", "v1:d"), sp("a", "v1:a")), store.ErrDenied, "already revoked")
		for _, bad := range []string{"0/2", "3/2", "1/", "a/b", "1/2/3", "+1/2", "1/1000", " 1/2"} {
			wantErr(t, shard("ap3", bad, sp("m", "v1:m")), store.ErrInvalid, "is not K/N")
		}
	})
}
