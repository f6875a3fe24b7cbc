package service

import (
	"strconv"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// describe is a plan's gates and conflicts as one line each, for comparisons.
func describe(x *api.ExecutionGates) []string {
	var out []string
	for _, g := range x.Gates {
		line := g.Class + " " + g.Target + " [" + strings.Join(g.Stacks, " ") + "]"
		if g.Satisfied {
			line += " satisfied by " + g.GrantedBy
		}
		out = append(out, line)
	}
	for _, c := range x.Conflicts {
		out = append(out, "claimed by #"+strconv.Itoa(c.PR)+" ("+c.ExecutionID+") ["+strings.Join(c.Stacks, " ")+"]")
	}
	return out
}

func wantLines(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("%s:\n%s\nwant:\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A plan's gates come from the policy over its classes, satisfied only by a grant of its own
// content (with who granted it and when), and its conflicts name the other PRs' claims on the
// stacks it changes; the gate list says the same of the grant.
func TestExecutionGatesSaysWhatAPlanNeeds(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.planWith("p1", 1, "s1", map[string][2]string{"a": {"destructive", "h-a"}, "b": {"mutating", "h-b"}, "c": {"no-changes", ""}})
		x, err := f.ExecutionGates(ctx, reader, "p1")
		f.must(err)
		if !x.Policy || x.Blocked != "" || x.Repo != testRepo || x.Environment != "prod" || x.PR != 1 || x.ExecutionID != "p1" {
			t.Fatalf("header %+v", x)
		}
		wantLines(t, "p1 before its approval", describe(x), "destructive ** [a]")

		f.must(f.approve(1, "p1"))
		approvedAt := f.now
		x, err = f.ExecutionGates(ctx, reader, "p1")
		f.must(err)
		wantLines(t, "p1 after its approval", describe(x), "destructive ** [a] satisfied by alice")
		if g := x.Gates[0]; g.GrantID <= 0 || !g.GrantedAt.Equal(approvedAt) {
			t.Fatalf("grant %d at %v, want a grant id at %v", g.GrantID, g.GrantedAt, approvedAt)
		}
		listed, err := f.Gates(ctx, reader, everyRow("prod", 1), "")
		f.must(err)
		if len(listed) != 1 || !listed[0].Satisfied || listed[0].GrantID != x.Gates[0].GrantID || listed[0].GrantedBy != "alice" {
			t.Fatalf("gate list %+v, want the same grant %d", listed, x.Gates[0].GrantID)
		}

		// PR 2 plans a stack PR 1 claims: its answer names PR 1's claim, PR 1's names none.
		f.planWith("p2", 2, "s2", map[string][2]string{"a": {"mutating", "h-a2"}, "d": {"destructive", "h-d"}})
		x, err = f.ExecutionGates(ctx, reader, "p2")
		f.must(err)
		wantLines(t, "p2", describe(x), "destructive ** [d]", "claimed by #1 (p1) [a]")
		x, err = f.ExecutionGates(ctx, reader, "p1")
		f.must(err)
		wantLines(t, "p1 beside p2", describe(x), "destructive ** [a] satisfied by alice")

		// A newer plan of PR 1 with other content on a: the grant does not cover it.
		f.planWith("p3", 1, "s3", map[string][2]string{"a": {"destructive", "h-a3"}})
		x, err = f.ExecutionGates(ctx, reader, "p3")
		f.must(err)
		wantLines(t, "p3", describe(x), "destructive ** [a]")
	})
}

// An environment the policy names without gates needs none; one it does not name has no policy,
// and the answer says so. A failed plan says why it cannot be approved.
func TestExecutionGatesWithoutPolicyAndOfAFailedPlan(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.plan("dev1", "dev", 1, "s1", map[string]api.Class{"a": "destructive"})
		x, err := f.ExecutionGates(ctx, reader, "dev1")
		f.must(err)
		if !x.Policy || len(x.Gates) != 0 || len(x.Conflicts) != 0 {
			t.Fatalf("dev: %+v, want a policy and no gates", x)
		}
		f.plan("qa1", "qa", 1, "s1", map[string]api.Class{"a": "destructive"})
		x, err = f.ExecutionGates(ctx, reader, "qa1")
		f.must(err)
		if x.Policy || len(x.Gates) != 0 {
			t.Fatalf("qa: %+v, want no policy", x)
		}

		_, err = f.Init(ctx, runner, &api.Init{ExecutionID: "bad", Environment: "prod", Op: "plan", PR: 3, SHA: "s", Stacks: []string{"a", "b"}})
		f.must(err)
		_, err = f.Finalize(ctx, runner, &api.Finalize{ExecutionID: "bad", Status: "failed", Stacks: []api.StackResult{
			{Stack: "a", Status: "succeeded", Class: "destructive", PlanHash: "h-a"}, {Stack: "b", Status: "failed"}}})
		f.must(err)
		x, err = f.ExecutionGates(ctx, reader, "bad")
		f.must(err)
		if !strings.Contains(x.Blocked, "ended failed") || strings.Contains(x.Blocked, store.ErrPrecondition.Error()) {
			t.Fatalf("blocked %q, want the plan's failure in plain words", x.Blocked)
		}
		wantLines(t, "failed plan", describe(x), "destructive ** [a]")

		_, err = f.Init(ctx, runner, &api.Init{ExecutionID: "ap", Environment: "prod", Op: "apply", PR: 3, SHA: "s", Stacks: []string{"a"}})
		f.must(err)
		_, err = f.ExecutionGates(ctx, reader, "ap")
		wantErr(t, err, store.ErrPrecondition, "not a plan")
	})
}

// A caller of another repository learns nothing of an execution: it is answered as an unknown
// one. A bad id is refused before the store is read.
func TestExecutionGatesOfAnotherRepositoryIsNotFound(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.planWith("p1", 1, "s1", map[string][2]string{"a": {"destructive", "h-a"}})
		other := Caller{Name: "viewer", Repositories: []string{"acme/other"}}
		_, errKnown := f.ExecutionGates(ctx, other, "p1")
		_, errUnknown := f.ExecutionGates(ctx, other, "nope")
		wantErr(t, errKnown, store.ErrNotFound, "p1")
		wantErr(t, errUnknown, store.ErrNotFound, "nope")
		if strings.Replace(errKnown.Error(), "p1", "nope", 1) != errUnknown.Error() {
			t.Fatalf("another repository's execution: %v; an unknown one: %v", errKnown, errUnknown)
		}
		job := Caller{Name: "github:acme/infra:run:1", Repositories: []string{testRepo}, GitHub: &GitHubJob{Repository: testRepo, Ref: "refs/pull/1/merge"}}
		if _, err := f.ExecutionGates(ctx, job, "p1"); err != nil {
			t.Fatalf("the PR's own job: %v", err)
		}
		_, err := f.ExecutionGates(ctx, reader, "p1\x00")
		wantErr(t, err, store.ErrInvalid, "execution_id")
	})
}
