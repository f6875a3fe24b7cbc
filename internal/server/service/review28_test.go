package service

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Regression tests of a review of the trust model: each attack here once succeeded.

// A lease is ended only by who holds it: not by another token of the same principal's name
// limited to another repository, not by another job of the run that took it (jobs of one run
// share a principal) unless that job too may check the gate, and a lease that records no
// principal only by an admin.
func TestOnlyTheHolderEndsALease(t *testing.T) {
	forEachStoreWith(t, trustPolicy, func(t *testing.T, f *fixture) {
		f.must(f.planBy(prJob(7, "100"), "a1", 7, dbPlan))
		f.must(f.approveAs("a1", 7, "stacks/prod/**"))
		hashes := sp("stacks/prod/db", "v1:db")
		active := func(id string) bool {
			t.Helper()
			return f.lease(id).RevokedAt.IsZero()
		}

		_, err := f.checkAs(who("deployer"), "ap1", 7, hashes)
		f.must(err)
		// A second token named deployer, limited to another repository.
		otherDeployer := Caller{Name: "deployer", Repositories: []string{"acme/other"}}
		_, err = f.GateRevoke(ctx, otherDeployer, &api.GateRevoke{ExecutionID: "ap1", Outcome: "failed"})
		f.must(err) // as for an execution without a lease: nothing is learned, nothing ends
		if !active("ap1") {
			t.Fatal("a token of another repository ended deployer's lease")
		}
		_, err = f.GateRevoke(ctx, who("deployer"), &api.GateRevoke{ExecutionID: "ap1", Outcome: "failed"})
		f.must(err)
		if active("ap1") {
			t.Fatal("the holder's revoke left its lease active")
		}

		f.must(f.approveAs("a1", 7, "stacks/prod/**"))
		_, err = f.checkAs(applyJob("300"), "ap2", 7, hashes)
		f.must(err)
		_, err = f.GateRevoke(ctx, applyJob("301"), &api.GateRevoke{ExecutionID: "ap2", Outcome: "failed"})
		wantErr(t, err, store.ErrDenied, "granted to another principal")
		lint := job(testRepo, "refs/heads/main", ".github/workflows/lint.yml", "", "300")
		_, err = f.GateRevoke(ctx, lint, &api.GateRevoke{ExecutionID: "ap2", Outcome: "failed"})
		wantErr(t, err, store.ErrDenied, "granted to another job of the run")
		if !active("ap2") {
			t.Fatal("another job of the run ended the apply job's lease")
		}
		_, err = f.GateRevoke(ctx, applyJob("300"), &api.GateRevoke{ExecutionID: "ap2", Outcome: "failed"})
		f.must(err)

		f.must(f.Store.Write(ctx, func(tx store.Tx) error {
			return tx.PutLease(store.Lease{Repo: testRepo, ExecutionID: "old", Environment: "prod", PR: 7, Requester: "r",
				GrantedAt: f.now, ExpiresAt: f.now.Add(DefaultLeaseTTL)})
		}))
		_, err = f.GateRevoke(ctx, who("anyone"), &api.GateRevoke{ExecutionID: "old", Outcome: "failed"})
		wantErr(t, err, store.ErrDenied, "records no principal")
		_, err = f.GateRevoke(ctx, adminOf("root"), &api.GateRevoke{ExecutionID: "old", Outcome: "failed"})
		f.must(err)
		if active("old") {
			t.Fatal("an admin's revoke left the lease active")
		}
	})
}

// What reaches the audit log from requests and tokens (a sha, a reason, a job's claims, a
// principal's name) cannot forge an entry with a newline nor reorder one with bidirectional
// overrides: it is stored written out. Names (environments, execution ids, stacks) with such
// characters are refused outright.
func TestAuditTextsAreInert(t *testing.T) {
	forEachStoreWith(t, trustPolicy, func(t *testing.T, f *fixture) {
		f.must(f.planBy(prJob(7, "100"), "a1", 7, dbPlan))
		forged := "abc\n2026-03-01T12:00:00Z root gates.satisfy granted \u202eevil\u2066x\u2069\u2028"
		j := prJob(7, "100")
		j.GitHub.Claims = "ref=refs/pull/7/merge actor=\u202emallory\nforged"
		// A sha with a control character is refused outright (issue 37); one with
		// bidirectional and line-separating characters reaches the audit, written out.
		_, err := f.GateCheck(ctx, j, &api.GateCheck{ExecutionID: "ap1", Environment: "prod", PR: 7, SHA: forged,
			Stacks: []api.StackPlan{sp("stacks/prod/db", "v1:db")}})
		wantErr(t, err, store.ErrInvalid, "control character")
		_, err = f.GateCheck(ctx, j, &api.GateCheck{ExecutionID: "ap1", Environment: "prod", PR: 7, SHA: strings.Replace(forged, "\n", "\u2028", 1),
			Stacks: []api.StackPlan{sp("stacks/prod/db", "v1:db")}})
		wantErr(t, err, store.ErrDenied, "apply_from")
		_, err = f.SatisfyGate(ctx, adminOf("alice\u202e"), &api.GatesSatisfy{PR: 7, Environment: "prod", Class: "destructive",
			Target: "stacks/prod/**", Reason: forged, ExecutionID: "a1"})
		f.must(err)
		entries, err := f.Audit(ctx, reader, "", 10, 0)
		f.must(err)
		if len(entries) != 2 {
			t.Fatalf("audit %+v, want the check and the approval", entries)
		}
		for _, e := range entries {
			for _, v := range []string{e.Principal, e.Target, e.Reason, e.Outcome, e.Detail} {
				if strings.ContainsAny(v, "\n\r\u202e\u2066\u2069\u2028") {
					t.Fatalf("audit entry %+v holds a raw control or bidirectional character in %q", e, v)
				}
			}
		}
		if !strings.Contains(entries[1].Detail, `sha abc\u{2028}2026-03-01T12:00:00Z root gates.satisfy granted \u{202E}evil`) ||
			!strings.Contains(entries[1].Detail, `actor=\u{202E}mallory\nforged`) || entries[0].Principal != `alice\u{202E}` {
			t.Fatalf("audit %+v: the texts are not written out", entries)
		}
		for _, name := range []string{"prod\u202e", "a\u2066b", "x\u2028y"} {
			_, err = f.Init(ctx, runner, &api.Init{ExecutionID: name, Environment: "prod", Op: "plan", PR: 1})
			wantErr(t, err, store.ErrInvalid, "bidirectional formatting or line-separating character")
			_, err = f.Init(ctx, runner, &api.Init{ExecutionID: "e", Environment: name, Op: "plan", PR: 1})
			wantErr(t, err, store.ErrInvalid, "bidirectional formatting or line-separating character")
		}
	})
}

// Releasing the claims of an execution of another repository is answered as for an unknown
// execution: the answer does not tell which ids another repository's executions have.
func TestReleaseClaimsDoesNotRevealAnotherRepositorysExecutions(t *testing.T) {
	forEachStoreWith(t, trustPolicy, func(t *testing.T, f *fixture) {
		f.must(f.planBy(who("ci"), "i1", 7, dbPlan))
		other := Caller{Name: "ci", Repositories: []string{"acme/other"}}
		_, errKnown := f.ReleaseClaims(ctx, other, &api.ClaimsRelease{Environment: "prod", PR: 7, ExecutionID: "i1"})
		_, errUnknown := f.ReleaseClaims(ctx, other, &api.ClaimsRelease{Environment: "prod", PR: 7, ExecutionID: "nope"})
		wantErr(t, errKnown, store.ErrNotFound, `execution "i1"`)
		wantErr(t, errUnknown, store.ErrNotFound, `execution "nope"`)
		if strings.Replace(errKnown.Error(), "i1", "nope", 1) != errUnknown.Error() {
			t.Fatalf("another repository's execution: %v; an unknown one: %v", errKnown, errUnknown)
		}
		if claims, _ := f.Claims(ctx, reader, "", "prod"); len(claims) != 1 {
			t.Fatalf("claims %+v", claims)
		}
	})
}

// Environments are shared by the server's repositories. A job of another repository that calls
// acme/infra's apply workflow as a reusable workflow has acme/infra's job_workflow_ref, on main,
// in a GitHub environment it names itself: it does not pass apply_from (nor take prod's lease for
// its own repository's PR) unless apply_from's repositories name its repository.
func TestAJobOfAnotherRepositoryDoesNotPassThroughItsWorkflow(t *testing.T) {
	forEachStoreWith(t, trustPolicy, func(t *testing.T, f *fixture) {
		const evil = "evil/repo"
		ci := Caller{Name: "ci-evil", Repositories: []string{evil}}
		f.must(f.planBy(ci, "e1", 7, dbPlan))
		caller := job(evil, "refs/heads/main", "", "prod", "500").withWorkflow("acme/infra/.github/workflows/apply.yml@refs/heads/main")
		_, err := f.Init(ctx, caller, &api.Init{Repo: evil, ExecutionID: "ap-evil", Environment: "prod", Op: "apply", PR: 7})
		wantErr(t, err, store.ErrDenied, "reports PR #7 only when it matches")
		_, err = f.GateCheck(ctx, caller, &api.GateCheck{Repo: evil, ExecutionID: "ap-evil2", Environment: "prod", PR: 7, SHA: "x",
			Stacks: []api.StackPlan{sp("stacks/prod/db", "v1:db")}})
		wantErr(t, err, store.ErrDenied, `the job's workflow "acme/infra/.github/workflows/apply.yml@refs/heads/main" is not of its repository evil/repo`)
		// acme/infra's own apply job still passes, and an apply_from naming repositories
		// decides by them alone.
		f.must(f.planBy(prJob(7, "100"), "a1", 7, dbPlan))
		f.must(f.approveAs("a1", 7, "stacks/prod/**"))
		_, err = f.checkAs(applyJob("300"), "ap1", 7, sp("stacks/prod/db", "v1:db"))
		f.must(err)
		p, err := ParsePolicy("p.hcl", []byte(`environment "prod" {
  requester = "d@p.iam.gserviceaccount.com"
  apply_from {
    repositories = ["ACME/Infra"]
    workflows    = ["acme/shared/.github/workflows/apply.yml@refs/heads/main"]
    principals   = ["deployer"]
  }
}`))
		f.must(err)
		ep := p.Environments["prod"]
		shared := applyJob("301").withWorkflow("acme/shared/.github/workflows/apply.yml@refs/heads/main")
		if why := ep.MayCheckGate("prod", testRepo, shared); why != "" {
			t.Fatalf("acme/infra's job through the shared workflow named with its repository: %s", why)
		}
		if why := ep.MayCheckGate("prod", evil, job(evil, "refs/heads/main", "", "", "501").withWorkflow("acme/shared/.github/workflows/apply.yml@refs/heads/main")); !strings.Contains(why, "repository evil/repo is not among") {
			t.Fatalf("another repository's job through the shared workflow: %q", why)
		}
		if why := ep.MayCheckGate("prod", evil, Caller{Name: "deployer"}); why == "" {
			t.Fatal("a principal of apply_from passed in a repository apply_from does not name")
		}
	})
}

// A check naming the execution id of another repository's lease is denied without learning
// that lease's environment or PR.
func TestAGateCheckDoesNotTellAnotherRepositorysLease(t *testing.T) {
	forEachStoreWith(t, trustPolicy, func(t *testing.T, f *fixture) {
		f.must(f.planBy(who("ci"), "i1", 42, map[string][2]string{"stacks/prod/app": {"mutating", "v1:app"}}))
		_, err := f.checkAs(who("deployer"), "ap1", 42, sp("stacks/prod/app", "v1:app"))
		f.must(err)
		other := Caller{Name: "deployer", Repositories: []string{"acme/other"}}
		_, err = f.GateCheck(ctx, other, &api.GateCheck{Repo: "acme/other", ExecutionID: "ap1", Environment: "prod", PR: 1, SHA: "x",
			Stacks: []api.StackPlan{sp("stacks/prod/app", "v1:app")}})
		wantErr(t, err, store.ErrDenied, "already holds a lease of another repository")
		if strings.Contains(err.Error(), "42") || strings.Contains(err.Error(), "acme/infra") {
			t.Fatalf("the denial tells the other repository's lease: %v", err)
		}
		if l := f.lease("ap1"); !l.RevokedAt.IsZero() || l.Repo != testRepo {
			t.Fatalf("the other repository's lease after the check %+v", l)
		}
	})
}

// Every time a client sends outside 1970 to 2200 (the stores' nanoseconds end in 2262; a time
// in 9999 would read as one in 1816) is refused with 400 naming its field, and nothing of the
// request is stored; times at the bounds are taken.
func TestEventTimesOutOfTheStoresRangeAreRefused(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		far, early := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(1969, 12, 31, 23, 59, 59, 0, time.UTC)
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e0", Environment: "prod", Op: "plan", Stacks: []string{"a"}, StartedAt: far})
		wantErr(t, err, store.ErrInvalid, "started_at 9999-01-01T00:00:00Z is outside 1970-01-01 to 2200-01-01")
		if _, err := f.Execution(ctx, reader, "e0"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a refused Init stored its execution: %v", err)
		}
		_, err = f.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", Stacks: []string{"a"}})
		f.must(err)
		_, err = f.Phase(ctx, runner, &api.PhaseEvent{ExecutionID: "e1", Stack: "a", Phase: "plan", Seq: 1, At: far})
		wantErr(t, err, store.ErrInvalid, "at 9999-01-01T00:00:00Z is outside")
		_, err = f.Phases(ctx, runner, []api.PhaseEvent{{ExecutionID: "e1", Stack: "a", Phase: "init", Seq: 1}, {ExecutionID: "e1", Stack: "a", Phase: "plan", Seq: 2, At: early}})
		wantErr(t, err, store.ErrInvalid, "at 1969-12-31T23:59:59Z is outside")
		_, err = f.Update(ctx, runner, &api.Update{ExecutionID: "e1", Stack: "a", Status: "running", Seq: 1, At: far})
		wantErr(t, err, store.ErrInvalid, "at 9999-01-01T00:00:00Z is outside")
		_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "e1", Status: "failed", FinishedAt: time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC)})
		wantErr(t, err, store.ErrInvalid, "finished_at 1000-01-01T00:00:00Z is outside")
		if _, err := ExecutionsAfter(store.ExecutionFilter{}, &far, nil); !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), "before 9999") {
			t.Fatalf("a page before 9999: %v", err)
		}
		x, err := f.Execution(ctx, reader, "e1")
		f.must(err)
		if !x.FinishedAt.IsZero() || x.Stacks[0].Phase != "" {
			t.Fatalf("refused events were stored: %+v", x)
		}
		_, err = f.Phase(ctx, runner, &api.PhaseEvent{ExecutionID: "e1", Stack: "a", Phase: "plan", Seq: 1, At: minTime})
		f.must(err)
		_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "e1", Status: "failed", FinishedAt: MaxTime})
		f.must(err)
		x, err = f.Execution(ctx, reader, "e1")
		f.must(err)
		// In range, but ahead of the server's clock: stored as when the server received it
		// (issue 37: retention goes by the server's clock).
		if !x.FinishedAt.Equal(f.now) {
			t.Fatalf("finished_at %s, want the server's %s", x.FinishedAt, f.now)
		}
	})
}

// A policy duration past what the stores hold is refused when read: a lease of "2500000h"
// would end in 2311, past the stores' nanoseconds, and wrap around to an end in the past.
func TestPolicyDurationsAreBounded(t *testing.T) {
	for _, src := range []string{`claim_ttl = "2500000h"`, "environment \"prod\" {\n  lease_ttl = \"2500000h\"\n}"} {
		if _, err := ParsePolicy("p.hcl", []byte(src)); err == nil || !strings.Contains(err.Error(), "longer than ten years") {
			t.Errorf("%s: %v", src, err)
		}
	}
	if _, err := ParsePolicy("p.hcl", []byte(`claim_ttl = "8760h"`)); err != nil {
		t.Error(err)
	}
}
