package service

import (
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/api"
)

// GatesOfPlan shows a plan's gates with the stacks and hashes an approval would cover, and
// whether the latest plan's content is approved; AppliesOf finds the apply that used a plan's
// grants, for callers of its repository only.
func TestGatesOfPlanAndAppliesOf(t *testing.T) {
	forEachStore(t, func(t *testing.T, f *fixture) {
		f.planWith("p1", 1, "s1", map[string][2]string{"m": {"mutating", "v1:m"}, "d": {"destructive", "v1:d"}})
		pg, err := f.GatesOfPlan(ctx, who("alice"), "p1")
		f.must(err)
		if pg.Latest != "p1" || pg.NotApplicable != "" || len(pg.Gates) != 1 || pg.Gates[0].Satisfied ||
			len(pg.Gates[0].Stacks) != 1 || pg.Gates[0].Stacks[0].Stack != "d" || pg.Gates[0].Stacks[0].PlanHash != "v1:d" {
			t.Fatalf("gates of p1: %+v", pg)
		}
		f.must(f.approve(1, "p1"))
		pg, err = f.GatesOfPlan(ctx, who("alice"), "p1")
		f.must(err)
		if !pg.Gates[0].Satisfied || len(pg.Gates[0].Grants) != 1 || pg.Gates[0].Grants[0].ExecutionID != "p1" {
			t.Fatalf("gates of p1 after approving: %+v", pg)
		}
		// Another repository's caller does not see the plan at all.
		if _, err := f.GatesOfPlan(ctx, Caller{Name: "eve", Repositories: []string{"acme/other"}}, "p1"); err == nil {
			t.Error("a caller of another repository read p1's gates")
		}
		_, err = f.check("ap1", 1, sp("m", "v1:m"), sp("d", "v1:d"))
		f.must(err)
		applies, err := f.AppliesOf(ctx, who("alice"), []string{"p1", "p9"})
		f.must(err)
		if len(applies) != 1 || applies[0].ExecutionID != "ap1" || applies[0].Plan != "p1" || len(applies[0].GrantIDs) != 1 {
			t.Fatalf("applies of p1: %+v", applies)
		}
		if other, err := f.AppliesOf(ctx, Caller{Name: "eve", Repositories: []string{"acme/other"}}, []string{"p1"}); err != nil || len(other) != 0 {
			t.Errorf("a caller of another repository sees p1's applies: %+v %v", other, err)
		}
		// A newer plan: p1's page names it, and its own gate is not approved.
		f.planWith("p2", 1, "s2", map[string][2]string{"d": {"destructive", "v1:d2"}})
		pg, err = f.GatesOfPlan(ctx, who("alice"), "p1")
		f.must(err)
		if pg.Latest != "p2" {
			t.Errorf("p1's latest: %q, want p2", pg.Latest)
		}
		pg, err = f.GatesOfPlan(ctx, who("alice"), "p2")
		f.must(err)
		if pg.Gates[0].Satisfied {
			t.Error("p2's gate is satisfied by p1's grant of other content")
		}
		// An apply execution requires no gate of its own.
		_, err = f.Init(ctx, runner, &api.Init{ExecutionID: "ap9", Environment: "prod", Op: "apply", PR: 1, SHA: "s2", Stacks: []string{"d"}})
		f.must(err)
		if pg, err := f.GatesOfPlan(ctx, who("alice"), "ap9"); err != nil || pg != nil {
			t.Errorf("gates of an apply: %+v %v", pg, err)
		}
	})
}
