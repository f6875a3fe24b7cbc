package service

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/store/postgres"
	"github.com/tfstackplan/tfstackplan/internal/server/store/sqlite"
	"github.com/tfstackplan/tfstackplan/internal/server/store/storetest"
)

// Regression tests of issue 37, the gaps an attacker found past the trust work: each attack
// here once succeeded. Each runs on every store.

// 1: a job of the apply's run that apply_from refuses (another GitHub environment) checks the
// gate naming the apply's execution: it is refused, and the apply job's lease stays active.
func TestARefusedSiblingJobLeavesTheLease(t *testing.T) {
	forEachStoreWith(t, trustPolicy, func(t *testing.T, f *fixture) {
		f.must(f.planBy(prJob(7, "100"), "a7", 7, dbPlan))
		f.must(f.approveAs("a7", 7, "stacks/prod/**"))
		hashes := sp("stacks/prod/db", "v1:db")
		_, err := f.checkAs(applyJob("555"), "a1", 7, hashes)
		f.must(err)
		dev := job(testRepo, "refs/heads/main", ".github/workflows/apply.yml", "dev", "555")
		_, err = f.checkAs(dev, "a1", 7, hashes)
		wantErr(t, err, store.ErrDenied, `the job's GitHub environment "dev" is not among apply_from's environments`)
		_, err = f.GateRevoke(ctx, dev, &api.GateRevoke{ExecutionID: "a1", Outcome: "failed"})
		wantErr(t, err, store.ErrDenied, "granted to another job of the run")
		if l := f.lease("a1"); !l.RevokedAt.IsZero() {
			t.Fatalf("a refused job of the run ended the apply job's lease: %s", l.Outcome)
		}
		// The apply job itself still re-checks and ends its own lease.
		_, err = f.checkAs(applyJob("555"), "a1", 7, hashes)
		f.must(err)
		_, err = f.GateRevoke(ctx, applyJob("555"), &api.GateRevoke{ExecutionID: "a1", Outcome: "succeeded"})
		f.must(err)
	})
}

// reusablePolicy lets a reusable workflow of another repository check acme/infra's gates, with
// no refs: pull requests' jobs call it too.
const reusablePolicy = `
environment "prod" {
  requester = "deployer@proj.iam.gserviceaccount.com"
  apply_from {
    repositories = ["acme/infra"]
    workflows    = ["acme/workflows/.github/workflows/deploy.yml@refs/heads/main"]
  }
  gate {
    classes = ["destructive"]
    stacks  = ["stacks/prod/**"]
  }
}
`

// 2: a job of pull request 5 that apply_from allows (through a reusable workflow, no refs)
// checks, revokes and releases only PR 5's: PR 7's approval, lease and claims are not its own.
func TestAPullRequestsJobActsOnlyOnItsPullRequest(t *testing.T) {
	forEachStoreWith(t, reusablePolicy, func(t *testing.T, f *fixture) {
		pr := func(n int, run string) Caller {
			return prJob(n, run).withWorkflow("acme/workflows/.github/workflows/deploy.yml@refs/heads/main")
		}
		f.must(f.planBy(prJob(7, "700"), "p7", 7, dbPlan))
		f.must(f.approveAs("p7", 7, "stacks/prod/**"))
		f.must(f.planBy(prJob(5, "500"), "p5", 5, map[string][2]string{"stacks/prod/app": {"destructive", "v1:app"}}))
		f.must(f.approveAs("p5", 5, "stacks/prod/**"))

		_, err := f.checkAs(pr(5, "501"), "ap5", 7, sp("stacks/prod/db", "v1:db"))
		wantErr(t, err, store.ErrDenied, "a job of pull request #5 acts only on PR #5, not #7")
		var leases int
		f.must(f.Store.Read(ctx, func(tx store.Tx) error {
			_, err := tx.Lease("ap5")
			if err == nil {
				leases++
			}
			return nil
		}))
		if leases != 0 {
			t.Fatal("PR 5's job took a lease on PR 7's approval")
		}
		_, err = f.checkAs(pr(5, "501"), "ap5", 5, sp("stacks/prod/app", "v1:app"))
		f.must(err)

		// A lease of PR 7 recorded for the same principal is still not PR 5's job's to end.
		f.must(f.Store.Write(ctx, func(tx store.Tx) error {
			return tx.PutLease(store.Lease{Repo: testRepo, ExecutionID: "ap7", Environment: "prod", PR: 7, Requester: "r",
				Principal: pr(5, "501").Name, GrantedAt: f.now, ExpiresAt: f.now.Add(DefaultLeaseTTL)})
		}))
		_, err = f.GateRevoke(ctx, pr(5, "501"), &api.GateRevoke{ExecutionID: "ap7", Outcome: "succeeded"})
		wantErr(t, err, store.ErrDenied, "is another pull request's")
		if !f.lease("ap7").RevokedAt.IsZero() {
			t.Fatal("PR 5's job ended a lease of PR 7")
		}
		_, err = f.ReleaseClaims(ctx, prJob(5, "500"), &api.ClaimsRelease{Environment: "prod", PR: 7, ExecutionID: "p5"})
		wantErr(t, err, store.ErrDenied, "acts only on PR #5, not #7")
		claims, err := f.Claims(ctx, reader, "", "prod")
		f.must(err)
		if len(claims) != 2 {
			t.Fatalf("claims after PR 5's job's refused requests: %+v", claims)
		}
	})
}

// 5: a shard's numbers are written as the API's pattern has them: "01/2" is refused, and the
// refused check leases nothing.
func TestAShardWithALeadingZeroIsRefused(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.planWith("p1", 1, "s1", map[string][2]string{"a": {"mutating", "v1:a"}, "b": {"mutating", "v1:b"}})
		for _, bad := range []string{"01/2", "1/02", "001/2", "1/002"} {
			_, err := f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "ap", Environment: "prod", PR: 1, SHA: "head", Shard: bad,
				Stacks: []api.StackPlan{sp("a", "v1:a")}})
			wantErr(t, err, store.ErrInvalid, "is not K/N")
		}
		f.must(f.Store.Read(ctx, func(tx store.Tx) error {
			if _, err := tx.Lease("ap"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("a refused shard's check left a lease: %v", err)
			}
			return nil
		}))
		_, err := f.GateCheck(ctx, runner, &api.GateCheck{ExecutionID: "ap", Environment: "prod", PR: 1, SHA: "head", Shard: "1/2",
			Stacks: []api.StackPlan{sp("a", "v1:a")}})
		f.must(err)
	})
}

// Leases that never end: a re-check keeps the lease's end (lease_ttl after its first grant),
// and one past that end is denied.
func TestARecheckDoesNotExtendTheLease(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.planWith("p1", 1, "s1", map[string][2]string{"d": {"destructive", "v1:d"}})
		f.must(f.approve(1, "p1"))
		first, err := f.check("ap", 1, sp("d", "v1:d"))
		f.must(err)
		if want := f.now.Add(time.Hour); !first.ExpiresAt.Equal(want) {
			t.Fatalf("first lease until %s, want %s", first.ExpiresAt, want)
		}
		f.now = f.now.Add(50 * time.Minute)
		again, err := f.check("ap", 1, sp("d", "v1:d"))
		f.must(err)
		if !again.ExpiresAt.Equal(first.ExpiresAt) || !f.lease("ap").ExpiresAt.Equal(first.ExpiresAt) {
			t.Fatalf("a re-check moved the lease's end from %s to %s", first.ExpiresAt, again.ExpiresAt)
		}
		f.now = f.now.Add(10 * time.Minute)
		_, err = f.check("ap", 1, sp("d", "v1:d"))
		wantErr(t, err, store.ErrDenied, "a re-check does not extend it")
	})
}

// Retention by the runner's clock: an execution finalized "2199" is pruned like any other, as
// is one started (by the runner's clock) later than the server received it; retention goes by
// when the server received them.
func TestRetentionGoesByTheServersClock(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		far := time.Date(2199, 1, 1, 0, 0, 0, 0, time.UTC)
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "future", Environment: "prod", Op: "apply", PR: 5, Stacks: []string{"c"},
			StartedAt: f.now.Add(MaxStartAhead)})
		f.must(err)
		_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "future", Status: "failed", FinishedAt: far})
		f.must(err)
		x, err := f.Execution(ctx, reader, "future")
		f.must(err)
		if !x.FinishedAt.Equal(f.now) {
			t.Fatalf("finished_at %s sent %s, want the server's %s", x.FinishedAt, far, f.now)
		}
		f.now = f.now.Add(91 * 24 * time.Hour)
		n, err := f.PruneExecutions(ctx, 90*24*time.Hour)
		f.must(err)
		if _, err := f.Execution(ctx, reader, "future"); n != 1 || !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("pruned %d; the execution finalized 2199: %v, want it pruned", n, err)
		}
	})
}

// replicas opens n stores of backend b on one database, as n replicas of serve would.
func replicas(t *testing.T, b storetest.Backend, n int) []store.Store {
	t.Helper()
	var out []store.Store
	switch b.Name {
	case "sqlite":
		path := filepath.Join(t.TempDir(), "shared.db")
		for range n {
			s, err := sqlite.Open(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			out = append(out, s)
		}
	default:
		u, channel := storetest.PostgresURL(t)
		for range n {
			s, err := postgres.Open(ctx, u, postgres.Options{Channel: channel})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			out = append(out, s)
		}
	}
	return out
}

// 4: after retention deleted an execution on one replica, its id is never announced again, on
// any replica: the owner another replica cached for it can never write into another principal's
// execution of the same id.
func TestAPrunedExecutionsIdIsNeverReused(t *testing.T) {
	for _, b := range storetest.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			p, err := ParsePolicy("policy.hcl", []byte(testPolicy))
			if err != nil {
				t.Fatal(err)
			}
			now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
			stores := replicas(t, b, 2)
			a, c := New(stores[0], p), New(stores[1], p)
			a.Now, c.Now = func() time.Time { return now }, func() time.Time { return now }
			must := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			old, other := who("old-owner"), who("new-owner")
			_, err = a.Init(ctx, old, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "apply", PR: 1, Stacks: []string{"a"}})
			must(err)
			// Replica c caches e1's owner with the old owner's first event there.
			_, err = c.Phase(ctx, old, &api.PhaseEvent{ExecutionID: "e1", Stack: "a", Phase: "init", Seq: 1})
			must(err)
			_, err = a.Finalize(ctx, old, &api.Finalize{ExecutionID: "e1", Status: "failed"})
			must(err)
			now = now.Add(100 * 24 * time.Hour)
			n, err := a.PruneExecutions(ctx, 90*24*time.Hour)
			if err != nil || n != 1 {
				t.Fatalf("prune: %d %v, want e1 pruned", n, err)
			}
			for _, r := range []*Service{a, c} {
				_, err = r.Init(ctx, other, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", PR: 2, Stacks: []string{"b"}})
				wantErr(t, err, store.ErrPrecondition, "ids are never reused")
			}
			if _, err := c.Update(ctx, old, &api.Update{ExecutionID: "e1", Stack: "b", Seq: 9, Status: "succeeded", Class: "mutating", PlanHash: "forged"}); err == nil {
				t.Error("the old owner wrote into a pruned execution through the replica that cached it")
			}
			if _, err := a.Execution(ctx, reader, "e1"); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("e1 after the refused re-announcements: %v, want not found", err)
			}
		})
	}
}

// Quotas per workflow run: the GitHub Actions jobs of one repository share
// ExecutionsPerHour, however many runs they start; another repository's jobs, and a static
// token's principal, have their own.
func TestARepositorysRunsShareTheExecutionQuota(t *testing.T) {
	forEachStoreWith(t, trustPolicy, func(t *testing.T, f *fixture) {
		f.Quotas = Quotas{ExecutionsPerHour: 3}
		initAs := func(c Caller, id string) error {
			_, err := f.Init(ctx, c, &api.Init{ExecutionID: id, Environment: "prod", Op: "plan", Stacks: []string{"a"}})
			return err
		}
		run := func(repo, id string) Caller {
			return job(repo, "refs/heads/feature", ".github/workflows/plan.yml", "", id)
		}
		for i := range 3 {
			f.must(initAs(run(testRepo, fmt.Sprint(100+i)), fmt.Sprint("r", i)))
		}
		err := initAs(run(testRepo, "200"), "r3")
		var qe *QuotaError
		if !errors.As(err, &qe) || !strings.Contains(err.Error(), "the GitHub Actions jobs of acme/infra announced 3 executions") {
			t.Fatalf("a fourth run's execution in the hour: %v", err)
		}
		f.must(initAs(run("acme/other", "300"), "o1"))
		f.must(initAs(who("ci"), "s1"))
	})
}

// Drift from unreviewed code: a drift execution comes only from a job apply_from allows, so a
// feature branch's workflow cannot overwrite a real "drifted" with "not drifted".
func TestDriftComesOnlyFromApplyFrom(t *testing.T) {
	forEachStoreWith(t, trustPolicy, func(t *testing.T, f *fixture) {
		drift := func(c Caller, id string) error {
			_, err := f.Init(ctx, c, &api.Init{ExecutionID: id, Environment: "prod", Op: "drift", Stacks: []string{"stacks/prod/db"}})
			return err
		}
		feature := job(testRepo, "refs/heads/feature", ".github/workflows/drift.yml", "", "800")
		wantErr(t, drift(feature, "d1"), store.ErrDenied, "a drift execution is reported only by a caller environment \"prod\"'s apply_from allows")
		wantErr(t, drift(who("ci"), "d2"), store.ErrDenied, "not among the principals")
		for _, id := range []string{"d1", "d2"} {
			if _, err := f.Execution(ctx, reader, id); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("refused drift %s was stored: %v", id, err)
			}
		}
		f.must(drift(applyJob("801"), "d3"))
		f.must(drift(who("deployer"), "d4"))
		f.must(drift(adminOf("root"), "d5"))
	})
}

// Merge over shards: a Finalize (run merge's) that contradicts a stack result a shard's own
// update recorded is refused (409) and changes nothing; one that agrees is taken.
func TestAMergeDoesNotOverrideTheShardsResults(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "ap", Environment: "prod", Op: "apply", PR: 1, Stacks: []string{"a", "b"}})
		f.must(err)
		_, err = f.Update(ctx, runner, &api.Update{ExecutionID: "ap", Stack: "a", Seq: 3, Status: "succeeded", Class: "destructive", PlanHash: "v1:a"})
		f.must(err)
		_, err = f.Update(ctx, runner, &api.Update{ExecutionID: "ap", Stack: "b", Seq: 3, Status: "failed", Class: "mutating"})
		f.must(err)
		for _, c := range []struct {
			r    api.StackResult
			want string
		}{
			{api.StackResult{Stack: "a", Status: "succeeded", Class: "additive", PlanHash: "v1:a"}, "its class is destructive, the finalize says additive"},
			{api.StackResult{Stack: "b", Status: "succeeded", Class: "mutating"}, "it ended failed, the finalize says succeeded"},
			{api.StackResult{Stack: "a", Status: "succeeded", Class: "destructive", PlanHash: "v1:other"}, "plan hash differs"},
		} {
			_, err := f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "ap", Status: "succeeded", Stacks: []api.StackResult{c.r}})
			wantErr(t, err, store.ErrMismatch, c.want)
		}
		x, err := f.Execution(ctx, reader, "ap")
		f.must(err)
		if x.Status != "running" || x.Stacks[0].Class != "destructive" || x.Stacks[1].Status != "failed" {
			t.Fatalf("a refused finalize changed the execution: %s %+v", x.Status, x.Stacks)
		}
		// A merge that lost a's shard result says a was skipped: it does not know, so what a's
		// shard recorded stands, and the finalize goes through (the execution is not left running).
		_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "ap", Status: "failed", Stacks: []api.StackResult{
			{Stack: "a", Status: "skipped"}, {Stack: "b", Status: "failed"}}})
		f.must(err)
		x, err = f.Execution(ctx, reader, "ap")
		f.must(err)
		if x.Status != "failed" || x.Stacks[0].Status != "succeeded" || x.Stacks[0].Class != "destructive" || x.Stacks[0].PlanHash != "v1:a" {
			t.Fatalf("after a merge that did not know how a ended: %s %+v", x.Status, x.Stacks)
		}
	})
}
