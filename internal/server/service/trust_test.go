package service

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Regression tests of the trust findings: a runner bound to its repository, its pull request
// and its job; the lease usable by the one apply job the gate allowed; approvals that name the
// plan they approve. Each runs on every store.

// trustPolicy gates destructive changes under stacks/prod and lets only the apply workflow on
// main, in the GitHub environment prod, or the static principal "deployer", check the gate.
const trustPolicy = `
environment "prod" {
  requester     = "deployer@proj.iam.gserviceaccount.com"
  runner_member = "principalSet://iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/gh/attribute.run_id/{run_id}"
  apply_from {
    refs         = ["refs/heads/main"]
    workflows    = ["acme/infra/.github/workflows/apply.yml@refs/heads/main"]
    environments = ["prod"]
    principals   = ["deployer"]
  }
  gate {
    classes = ["destructive"]
    stacks  = ["stacks/prod/**"]
  }
}
environment "dev" {
  requester = "dev@proj.iam.gserviceaccount.com"
}
`

// forEachStoreWith is forEachStore under another policy.
func forEachStoreWith(t *testing.T, policy string, fn func(t *testing.T, f *fixture)) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		p, err := ParsePolicy("policy.hcl", []byte(policy))
		f.must(err)
		f.Policy = p
		fn(t, f)
	})
}

// job is the caller of a GitHub Actions job of repo on ref, from workflow file wf (a path in
// repo, at ref), in GitHub environment env, of run id run.
func job(repo, ref, wf, env, run string) Caller {
	return Caller{
		Name:         "github:" + repo + ":run:" + run,
		Repositories: []string{repo},
		GitHub: &GitHubJob{Repository: repo, Ref: ref, JobWorkflowRef: repo + "/" + wf + "@" + ref, Environment: env,
			RunID: run, RunAttempt: "1", SHA: "abc", Actor: "alice", Claims: "repository=" + repo + " ref=" + ref + " run=" + run},
	}
}

// prJob is a plan job of pull request pr of acme/infra.
func prJob(pr int, run string) Caller {
	return job(testRepo, fmt.Sprintf("refs/pull/%d/merge", pr), ".github/workflows/plan.yml", "", run)
}

// applyJob is the apply workflow's job on main, in the GitHub environment prod.
func applyJob(run string) Caller {
	return job(testRepo, "refs/heads/main", ".github/workflows/apply.yml", "prod", run)
}

// planBy records a finalized plan announced by c of pr in prod with stacks and their classes and
// hashes.
func (f *fixture) planBy(c Caller, id string, pr int, stacks map[string][2]string) error {
	f.t.Helper()
	var names []string
	var results []api.StackResult
	for name, ch := range stacks {
		names = append(names, name)
		results = append(results, api.StackResult{Stack: name, Status: "succeeded", Class: api.Class(ch[0]), PlanHash: ch[1]})
	}
	f.now = f.now.Add(time.Second)
	if _, err := f.Init(ctx, c, &api.Init{ExecutionID: id, Environment: "prod", Op: "plan", PR: pr, SHA: "s-" + id, Stacks: names}); err != nil {
		return err
	}
	_, err := f.Finalize(ctx, c, &api.Finalize{ExecutionID: id, Status: "succeeded", Stacks: results})
	return err
}

func (f *fixture) checkAs(c Caller, id string, pr int, stacks ...api.StackPlan) (api.GateLease, error) {
	return f.GateCheck(ctx, c, &api.GateCheck{ExecutionID: id, Environment: "prod", PR: pr, SHA: "head", Stacks: stacks})
}

func (f *fixture) approveAs(plan string, pr int, target string) error {
	_, err := f.SatisfyGate(ctx, adminOf("alice"), &api.GatesSatisfy{PR: pr, Environment: "prod", Class: "destructive",
		Target: target, Reason: "reviewed", ExecutionID: plan})
	return err
}

var dbPlan = map[string][2]string{"stacks/prod/db": {"destructive", "v1:db"}}

// 1 and 3: a job of one pull request cannot post (or start and abandon) a plan under another's
// number, so the other's latest plan, its approval and its apply stay its own.
func TestAJobReportsOnlyItsOwnPullRequest(t *testing.T) {
	forEachStoreWith(t, trustPolicy, func(t *testing.T, f *fixture) {
		a, b := prJob(7, "100"), prJob(9, "200")
		f.must(f.planBy(a, "a1", 7, dbPlan))
		err := f.planBy(b, "b1", 7, map[string][2]string{"stacks/prod/db": {"destructive", "v1:evil"}})
		wantErr(t, err, store.ErrDenied, "a job of pull request #9 reports only PR #9, not #7")
		_, err = f.Init(ctx, b, &api.Init{ExecutionID: "b2", Environment: "prod", Op: "plan", PR: 7, Stacks: []string{"stacks/prod/db"}})
		wantErr(t, err, store.ErrDenied, "reports only PR #9")
		_, err = f.Init(ctx, b, &api.Init{ExecutionID: "b3", Environment: "prod", Op: "plan", PR: 0})
		wantErr(t, err, store.ErrDenied, "reports only PR #9, not #0")
		// A's plan is still the latest: approved, A's apply passes.
		f.must(f.approveAs("a1", 7, "stacks/prod/**"))
		_, err = f.checkAs(applyJob("300"), "ap1", 7, sp("stacks/prod/db", "v1:db"))
		f.must(err)
		// A job on another ref reports plans of no PR, or of any PR when apply_from allows it.
		other := job(testRepo, "refs/heads/feature", ".github/workflows/plan.yml", "", "400")
		_, err = f.Init(ctx, other, &api.Init{ExecutionID: "o1", Environment: "prod", Op: "plan", PR: 7})
		wantErr(t, err, store.ErrDenied, "reports PR #7 only when it matches")
		_, err = f.Init(ctx, other, &api.Init{ExecutionID: "o2", Environment: "prod", Op: "plan"})
		f.must(err)
		_, err = f.Init(ctx, applyJob("301"), &api.Init{ExecutionID: "o3", Environment: "prod", Op: "apply", PR: 7})
		f.must(err)
		// A later run of the same pull request replaces the earlier run's plan and claims.
		f.must(f.planBy(prJob(7, "101"), "a2", 7, map[string][2]string{"stacks/prod/app": {"mutating", "v1:app"}}))
		claims, err := f.Claims(ctx, reader, "", "prod")
		f.must(err)
		if len(claims) != 1 || claims[0].Stack != "stacks/prod/app" || claims[0].ExecutionID != "a2" {
			t.Fatalf("claims after the PR's second run %+v, want stacks/prod/app of a2 alone", claims)
		}
	})
}

// 2: a job that may not check the gate neither takes the lease nor, through its revoke, ends
// another PR's claims and approval.
func TestOnlyApplyFromMayCheckTheGate(t *testing.T) {
	forEachStoreWith(t, trustPolicy, func(t *testing.T, f *fixture) {
		f.must(f.planBy(prJob(7, "100"), "a1", 7, dbPlan))
		f.must(f.approveAs("a1", 7, "stacks/prod/**"))
		hashes := sp("stacks/prod/db", "v1:db")
		for _, c := range []struct {
			name   string
			caller Caller
			why    string
		}{
			{"the PR's own plan job", prJob(7, "100"), `the job's ref "refs/pull/7/merge" is not among apply_from's refs`},
			{"another PR's job", prJob(9, "200"), `not among apply_from's refs`},
			{"apply.yml edited on a PR branch", job(testRepo, "refs/heads/main", ".github/workflows/apply.yml", "prod", "201").withWorkflow("acme/infra/.github/workflows/apply.yml@refs/pull/9/merge"),
				`the job's workflow "acme/infra/.github/workflows/apply.yml@refs/pull/9/merge" is not among apply_from's workflows`},
			{"a job outside the GitHub environment", job(testRepo, "refs/heads/main", ".github/workflows/apply.yml", "", "202"),
				`the job's GitHub environment "" is not among apply_from's environments`},
			{"another workflow on main", job(testRepo, "refs/heads/main", ".github/workflows/other.yml", "prod", "203"), `workflow`},
			{"a static token not in principals", who("ci"), `ci is not among the principals of environment "prod"'s apply_from`},
		} {
			_, err := f.checkAs(c.caller, "x-"+c.caller.Name, 7, hashes)
			wantErr(t, err, store.ErrDenied, c.why)
			// Its revoke of a lease it does not hold ends nothing.
			_, err = f.GateRevoke(ctx, c.caller, &api.GateRevoke{ExecutionID: "x-" + c.caller.Name, Outcome: "succeeded"})
			f.must(err)
		}
		claims, err := f.Claims(ctx, reader, "", "prod")
		f.must(err)
		if len(claims) != 1 {
			t.Fatalf("claims after the refused checks and revokes %+v", claims)
		}
		// The apply workflow on main, in the environment, passes; so does the named principal.
		_, err = f.checkAs(applyJob("300"), "ap1", 7, hashes)
		f.must(err)
		_, err = f.checkAs(who("deployer"), "ap2", 7, hashes)
		f.must(err)
	})
}

// withWorkflow is c with another job_workflow_ref.
func (c Caller) withWorkflow(ref string) Caller {
	j := *c.GitHub
	j.JobWorkflowRef = ref
	c.GitHub = &j
	return c
}

// A gated environment without apply_from denies GitHub jobs, naming the missing block; static
// principals are as before.
func TestGitHubJobsNeedApplyFrom(t *testing.T) {
	forEachStoreWith(t, `
environment "prod" {
  requester = "deployer@proj.iam.gserviceaccount.com"
}
`, func(t *testing.T, f *fixture) {
		f.must(f.planBy(prJob(7, "100"), "a1", 7, dbPlan))
		_, err := f.checkAs(applyJob("300"), "ap1", 7, sp("stacks/prod/db", "v1:db"))
		wantErr(t, err, store.ErrDenied, `environment "prod" has no apply_from block`)
		_, err = f.checkAs(who("ci"), "ap2", 7, sp("stacks/prod/db", "v1:db"))
		f.must(err)
	})
}

// apply_from must name workflows for a GitHub job to pass: a ref alone would let any workflow
// on that ref take the lease, a GitHub environment alone any branch its rules let deploy. A
// policy giving refs or environments without workflows is refused when read; one giving only
// principals denies every GitHub job at the gate.
func TestGitHubJobsPassApplyFromOnlyThroughNamedWorkflows(t *testing.T) {
	for _, block := range []string{`refs = ["refs/heads/main"]`, `environments = ["prod"]`} {
		_, err := ParsePolicy("p.hcl", []byte("environment \"prod\" {\n  apply_from {\n    "+block+"\n  }\n}\n"))
		if err == nil || !strings.Contains(err.Error(), "no workflows") {
			t.Errorf("apply_from { %s }: %v, want a refusal naming the missing workflows", block, err)
		}
	}
	forEachStoreWith(t, `
environment "prod" {
  requester = "deployer@proj.iam.gserviceaccount.com"
  apply_from {
    principals = ["deployer"]
  }
}
`, func(t *testing.T, f *fixture) {
		f.must(f.planBy(prJob(7, "100"), "a1", 7, dbPlan))
		_, err := f.checkAs(applyJob("300"), "ap1", 7, sp("stacks/prod/db", "v1:db"))
		wantErr(t, err, store.ErrDenied, `environment "prod"'s apply_from names no workflows`)
		_, err = f.checkAs(who("deployer"), "ap2", 7, sp("stacks/prod/db", "v1:db"))
		f.must(err)
	})
}

// A plan job reports the classes that decide the gates, and a pull request may edit its own
// plan workflow: one reporting a destructive stack as additive, with the true plan hash, must not
// get the apply past the gate. The apply sends its own classification of the same content, and
// a difference denies (re-plan). A class that is none is refused.
func TestAnUnderReportedClassDoesNotPassTheGate(t *testing.T) {
	forEachStoreWith(t, trustPolicy, func(t *testing.T, f *fixture) {
		f.must(f.planBy(prJob(7, "100"), "a1", 7, map[string][2]string{"stacks/prod/db": {"additive", "v1:db"}}))
		honest := sp("stacks/prod/db", "v1:db")
		honest.Class = "destructive"
		_, err := f.checkAs(applyJob("300"), "ap1", 7, honest)
		wantErr(t, err, store.ErrDenied, `stacks whose plan the apply classifies otherwise (re-plan): "stacks/prod/db" (the plan reported it additive, the apply classifies it destructive)`)
		bogus := sp("stacks/prod/db", "v1:db")
		bogus.Class = "harmless"
		_, err = f.checkAs(applyJob("301"), "ap2", 7, bogus)
		wantErr(t, err, store.ErrInvalid, `class "harmless" is not one of`)
		// The same plan, classified alike by the apply: nothing destructive, no gate, a lease.
		agreed := sp("stacks/prod/db", "v1:db")
		agreed.Class = "additive"
		_, err = f.checkAs(applyJob("302"), "ap3", 7, agreed)
		f.must(err)
	})
}

// 4: an approval names the plan the approver reviewed; a re-plan that arrived meanwhile is not
// approved by it, and an approval of a gate the plan does not require is refused.
func TestAnApprovalNamesThePlanItApproves(t *testing.T) {
	forEachStoreWith(t, trustPolicy, func(t *testing.T, f *fixture) {
		a := prJob(7, "100")
		f.must(f.planBy(a, "reviewed", 7, dbPlan))
		// The runner re-plans other destructive content before the approval.
		f.must(f.planBy(prJob(7, "101"), "sneaked", 7, map[string][2]string{"stacks/prod/db": {"destructive", "v1:drop-all"}}))
		err := f.approveAs("reviewed", 7, "stacks/prod/**")
		wantErr(t, err, store.ErrStale, "execution reviewed is not the latest plan of acme/infra prod PR #7: plan sneaked")
		_, err = f.SatisfyGate(ctx, adminOf("alice"), &api.GatesSatisfy{PR: 7, Environment: "prod", Class: "destructive", Target: "stacks/prod/**", Reason: "r"})
		wantErr(t, err, store.ErrInvalid, "execution_id is required")
		_, err = f.checkAs(applyJob("300"), "ap1", 7, sp("stacks/prod/db", "v1:drop-all"))
		wantErr(t, err, store.ErrDenied, "no active grant")
		// The docs' old '**' approval of a stacks/prod/** gate approves nothing: refused, listing
		// the gates.
		err = f.approveAs("sneaked", 7, "**")
		wantErr(t, err, store.ErrPrecondition, `requires no gate destructive on "**"; the gates it requires: destructive on stacks/prod/** (stacks/prod/db)`)
		_, err = f.SatisfyGate(ctx, adminOf("alice"), &api.GatesSatisfy{PR: 7, Environment: "prod", Class: "destructive", Target: "stacks/prod/**",
			Reason: "r", ExecutionID: "sneaked", ExpiresAt: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)})
		wantErr(t, err, store.ErrInvalid, "expires_at 9999-01-01T00:00:00Z is outside 1970-01-01 to 2200-01-01")
		grants, err := f.Grants(ctx, reader, everyRow("prod", 7), 0)
		f.must(err)
		if len(grants) != 0 {
			t.Fatalf("grants after refused approvals %+v", grants)
		}
	})
}

// 5: a stack is named in one spelling; a glob matches it whatever its case.
func TestStackPathsAreCanonical(t *testing.T) {
	forEachStoreWith(t, trustPolicy, func(t *testing.T, f *fixture) {
		for _, bad := range []string{"./stacks/prod/db", "stacks//prod/db", "stacks/prod/./db", "stacks/prod/x/../db", "/stacks/prod/db", "stacks/prod/db/", `stacks\prod\db`} {
			_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e", Environment: "prod", Op: "plan", PR: 1, Stacks: []string{bad}})
			wantErr(t, err, store.ErrInvalid, "stack")
			_, err = f.Init(ctx, runner, &api.Init{ExecutionID: "e", Environment: "prod", Op: "plan", PR: 1, Edges: []api.Edge{{From: "a", To: bad}}})
			wantErr(t, err, store.ErrInvalid, "edge to")
			_, err = f.checkAs(who("deployer"), "ap", 1, sp(bad, "v1:x"))
			wantErr(t, err, store.ErrInvalid, "stack")
			_, err = f.ReleaseClaims(ctx, adminOf("root"), &api.ClaimsRelease{Environment: "prod", PR: 1, Stack: bad, Reason: "x"})
			wantErr(t, err, store.ErrInvalid, "stack")
		}
		_, err := f.Init(ctx, runner, &api.Init{ExecutionID: "e1", Environment: "prod", Op: "plan", PR: 1, Stacks: []string{"stacks/prod/db"}})
		f.must(err)
		for _, bad := range []string{"./stacks/prod/db", "stacks//prod/db"} {
			_, err = f.Update(ctx, runner, &api.Update{ExecutionID: "e1", Stack: bad, Status: "running"})
			wantErr(t, err, store.ErrInvalid, "not a canonical path")
			_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "e1", Status: "succeeded", Stacks: []api.StackResult{{Stack: bad, Status: "succeeded"}}})
			wantErr(t, err, store.ErrInvalid, "not a canonical path")
		}
		// Spelled in another case, the stack is still gated.
		f.must(f.planBy(who("ci"), "p1", 2, map[string][2]string{"Stacks/Prod/DB": {"destructive", "v1:db"}}))
		_, err = f.checkAs(who("deployer"), "ap1", 2, sp("Stacks/Prod/DB", "v1:db"))
		wantErr(t, err, store.ErrDenied, "no active grant approved this plan's content for gate destructive on stacks/prod/** (stacks Stacks/Prod/DB)")
	})
}

// 6: two repositories on one server: PR 42 of one is not PR 42 of the other, and a principal
// limited to one reads and acts in it alone.
func TestRepositoriesDoNotShareAPullRequest(t *testing.T) {
	forEachStoreWith(t, trustPolicy, func(t *testing.T, f *fixture) {
		infra := who("ci-infra")
		other := Caller{Name: "ci-other", Repositories: []string{"acme/other"}}
		f.must(f.planBy(infra, "i1", 42, dbPlan))
		f.must(f.planBy(other, "o1", 42, map[string][2]string{"stacks/prod/db": {"destructive", "v1:other"}}))
		// Both claim stacks/prod/db, each in its repository.
		claims, err := f.Claims(ctx, Caller{Name: "root", Admin: true}, "", "prod")
		f.must(err)
		if len(claims) != 2 || claims[0].Repo != "acme/infra" || claims[1].Repo != "acme/other" {
			t.Fatalf("claims %+v", claims)
		}
		// An approval in one repository does not satisfy the other's gate.
		f.must(f.approveAs("i1", 42, "stacks/prod/**"))
		deployerOther := Caller{Name: "deployer", Repositories: []string{"acme/other"}}
		_, err = f.checkAs(deployerOther, "ap-o", 42, sp("stacks/prod/db", "v1:other"))
		wantErr(t, err, store.ErrDenied, "no active grant")
		_, err = f.checkAs(who("deployer"), "ap-i", 42, sp("stacks/prod/db", "v1:db"))
		f.must(err)
		// The other repository's approval names its own plan; infra's plan id is not its.
		_, err = f.SatisfyGate(ctx, Caller{Name: "bob", Admin: true, Repositories: []string{"acme/other"}}, &api.GatesSatisfy{Repo: "acme/other", PR: 42,
			Environment: "prod", Class: "destructive", Target: "stacks/prod/**", Reason: "r", ExecutionID: "i1"})
		wantErr(t, err, store.ErrStale, "is not the latest plan of acme/other prod PR #42: plan o1")
		// Limited principals read and act in their repository alone.
		if _, err := f.Execution(ctx, other, "i1"); err == nil {
			t.Fatal("a principal of acme/other read an execution of acme/infra")
		}
		_, err = f.Claims(ctx, other, "acme/infra", "")
		wantErr(t, err, store.ErrDenied, "ci-other may not act in repository acme/infra")
		_, err = f.Init(ctx, other, &api.Init{Repo: "ACME/Infra", ExecutionID: "x", Environment: "prod", Op: "plan", PR: 1})
		wantErr(t, err, store.ErrDenied, "may not act in repository acme/infra")
		_, err = f.Update(ctx, Caller{Name: "ci-infra", Admin: true, Repositories: []string{"acme/other"}}, &api.Update{ExecutionID: "i1", Stack: "stacks/prod/db", Status: "running"})
		wantErr(t, err, store.ErrNotFound, "i1")
		xs, err := f.Executions(ctx, other, store.ExecutionFilter{})
		f.must(err)
		if len(xs) != 1 || xs[0].ExecutionID != "o1" {
			t.Fatalf("executions listed to acme/other's principal %+v", xs)
		}
		_, err = f.Executions(ctx, Caller{Name: "root", Admin: true}, store.ExecutionFilter{PR: 42})
		wantErr(t, err, store.ErrInvalid, "pr 42 needs repo")
		_, err = f.Init(ctx, Caller{Name: "anyone"}, &api.Init{ExecutionID: "y", Environment: "prod", Op: "plan"})
		wantErr(t, err, store.ErrInvalid, "repo is required")
		entries, err := f.Audit(ctx, other, "", 100, 0)
		f.must(err)
		for _, e := range entries {
			if e.Repo != "acme/other" {
				t.Fatalf("audit entry of another repository listed to acme/other's principal: %+v", e)
			}
		}
	})
}

// 7: the lease's IAM member is filled from the verified claims of the job that passed the gate:
// during the lease, a binding exists for that run only, and the revoke removes it.
func TestTheLeaseIsBoundToTheRunThatPassedTheGate(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		fake := withIAM(t, f)
		p, err := ParsePolicy("policy.hcl", []byte(`
granter "gcp-iam" {
  endpoint         = "`+fake.URL+`"
  credentials_file = "`+fake.CredentialsFile(t)+`"
}
environment "prod" {
  requester     = "`+deployer+`"
  runner_member = "principalSet://iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/gh/attribute.run_id/{run_id}"
  apply_from {
    workflows = ["acme/infra/.github/workflows/apply.yml@refs/heads/main"]
  }
}
`))
		f.must(err)
		f.Policy = p
		f.must(f.planBy(prJob(7, "100"), "a1", 7, map[string][2]string{"stacks/prod/app": {"mutating", "v1:app"}}))
		_, err = f.checkAs(applyJob("31337"), "ap1", 7, sp("stacks/prod/app", "v1:app"))
		f.must(err)
		want := "principalSet://iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/gh/attribute.run_id/31337"
		if got := bound(fake, "ap1"); len(got) != 1 || got[0] != want {
			t.Fatalf("during the lease the requester binds %v, want only %s", got, want)
		}
		for _, b := range fake.Policy(deployer).Bindings {
			for _, m := range b.Members {
				if strings.Contains(m, "attribute.repository") || (strings.Contains(m, "run_id") && m != want) {
					t.Fatalf("a binding for more than the run: %+v", b)
				}
			}
		}
		_, err = f.GateRevoke(ctx, applyJob("31337"), &api.GateRevoke{ExecutionID: "ap1", Outcome: "succeeded"})
		f.must(err)
		if got := bound(fake, "ap1"); len(got) != 0 {
			t.Fatalf("after the revoke the requester binds %v", got)
		}
		// A static principal cannot fill the template: denied, and nothing is bound.
		p.Environments["prod"] = EnvPolicy{Requester: deployer, RunnerMember: p.Environments["prod"].RunnerMember}
		_, err = f.checkAs(who("ci"), "ap2", 7, sp("stacks/prod/app", "v1:app"))
		wantErr(t, err, store.ErrDenied, "runner_member names claims of a GitHub Actions job, and ci is not one")
		if got := bound(fake, "ap2"); len(got) != 0 {
			t.Fatalf("a refused check bound %v", got)
		}
	})
}

func TestRunnerMemberTemplates(t *testing.T) {
	for _, c := range []struct{ tmpl, err string }{
		{"principalSet://x/attribute.run_id/{run_id}", ""},
		{"principal://x/subject/repo:{repository}:environment:{environment}", ""},
		{"serviceAccount:ci@p.iam.gserviceaccount.com", ""},
		{"x/{nope}", "unknown placeholder {nope}"},
		{"x/{run_id", `a "{" without its "}"`},
		{"x/run_id}", `a "}" without its "{"`},
	} {
		_, err := ParsePolicy("p.hcl", []byte(`environment "prod" {
  requester     = "d@p.iam.gserviceaccount.com"
  runner_member = "`+c.tmpl+`"
}`))
		if (c.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("runner_member %q: %v, want %q", c.tmpl, err, c.err)
		}
	}
	ep := EnvPolicy{RunnerMember: "principalSet://x/attribute.run_id/{run_id}/{ref}"}
	bad := applyJob("1")
	bad.GitHub.Ref = "refs/heads/main x"
	if _, err := ep.MemberFor(bad); err == nil || !strings.Contains(err.Error(), "the job's ref claim") {
		t.Errorf("a claim with a space filled a member: %v", err)
	}
	bad.GitHub.RunID = ""
	ep.RunnerMember = "x/{run_id}"
	if _, err := ep.MemberFor(bad); err == nil {
		t.Error("an empty run_id filled a member")
	}
	_, err := ParsePolicy("p.hcl", []byte(`environment "prod" {
  apply_from {}
}`))
	if err == nil || !strings.Contains(err.Error(), "apply_from names nothing") {
		t.Errorf("an empty apply_from: %v", err)
	}
}

// The audit log records the verified claims of the GitHub job that acted.
func TestTheAuditRecordsTheJobsClaims(t *testing.T) {
	forEachStoreWith(t, trustPolicy, func(t *testing.T, f *fixture) {
		f.must(f.planBy(prJob(7, "100"), "a1", 7, dbPlan))
		_, _ = f.checkAs(prJob(7, "100"), "ap1", 7, sp("stacks/prod/db", "v1:db"))
		entries, err := f.Audit(ctx, reader, "", 10, 0)
		f.must(err)
		if len(entries) == 0 || entries[0].Action != "gate.check" || entries[0].Principal != "github:acme/infra:run:100" ||
			!strings.Contains(entries[0].Detail, "ref=refs/pull/7/merge run=100") || entries[0].Repo != testRepo {
			t.Fatalf("audit %+v", entries)
		}
	})
}
