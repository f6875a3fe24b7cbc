package plan

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/events"
)

// fitOracle is fitMarkdown done the slow way: every level rendered whole and measured, the
// destructive list cut one entry at a time, then the same last resort (cutToFit).
func fitOracle(r *Report, limit int) string {
	v := newRedactedView(r, r.secrets())
	whole := func(level mdLevel, keep int) string {
		out, _ := markdown(v, level, keep, math.MaxInt)
		return out
	}
	for level := mdFull; level < mdTrimDestroy; level++ {
		if out := whole(level, -1); len(out) <= limit {
			return out
		}
	}
	listed, _ := destructiveCount(r)
	best := whole(mdTrimDestroy, 0)
	for keep := 1; keep <= listed; keep++ {
		out := whole(mdTrimDestroy, keep)
		if len(out) > limit {
			break
		}
		best = out
	}
	return cutToFit(r, best, limit)
}

// TestFitMarkdownMatchesWholeRendersAtTheLimits holds the budgeted markdown renders to
// fitOracle where the budget decides: stacks at the most detail, whose first levels are
// megabytes; long stack names; thousands of destructive changes, cut by the binary search;
// names too long for any level, cut on a line.
func TestFitMarkdownMatchesWholeRendersAtTheLimits(t *testing.T) {
	template := benchDetailTemplate()
	detailed := &Report{ExecutionURL: planExecutionURL}
	for i := range 6 {
		detailed.Stacks = append(detailed.Stacks, benchDetailStack(template, fmt.Sprintf("stacks/app-%d", i)))
	}

	secret := strings.Repeat("0123456789abcdef", 400)
	named := &Report{ExecutionURL: planExecutionURL}
	for i := range 40 {
		s := benchDetailStack(template, fmt.Sprintf("stacks/%s/app-%d", secret, i))
		s.Changes, s.Outputs, s.Drift = s.Changes[:3], nil, nil
		s.OutputsChanged, s.DriftCount = 0, 0
		s.secrets = newSecretSet()
		s.secrets.add(secret)
		named.Stacks = append(named.Stacks, s)
	}

	destructive := &Report{ExecutionURL: planExecutionURL}
	for i := range 8 {
		s, _ := planGenerated(t, fmt.Sprintf("stacks/env/app-%d", i), genOptions{Changes: 700, Seed: uint64(i), Payload: 200, OnlyOf: ActionDelete, Secret: "destructive-secret"})
		destructive.Stacks = append(destructive.Stacks, s)
	}

	huge := &Report{ExecutionURL: planExecutionURL}
	for i := range 3 {
		huge.Stacks = append(huge.Stacks, &Stack{Name: fmt.Sprintf("stacks/%d/", i) + strings.Repeat("x\n", 20000),
			Class: events.ClassUnclassified, Error: "unreadable", Destructive: []Change{}, Changes: []Change{}})
	}

	for name, r := range map[string]*Report{"detailed": detailed, "named": named, "destructive": destructive, "huge": huge} {
		for _, limit := range []int{MaxCommentChars, MaxSummaryBytes, 3000, 20000, 150000} {
			if got, want := fitMarkdown(r, limit), fitOracle(r, limit); got != want {
				t.Fatalf("%s, limit %d: differs:\n%s", name, limit, planFirstDiff(got, want))
			}
		}
	}
}

// TestCommentCostBoundedByItsSize: the PR comment of stacks at the most detail costs about the
// same for 40 stacks as for 10 (it was rendered whole at every level until one fit: four
// times the memory for four times the stacks).
func TestCommentCostBoundedByItsSize(t *testing.T) {
	template := benchDetailTemplate()
	report := func(n int) *Report {
		r := &Report{ExecutionURL: planExecutionURL}
		for i := range n {
			r.Stacks = append(r.Stacks, benchDetailStack(template, fmt.Sprintf("stacks/env/app-%03d", i)))
		}
		return r
	}
	small, large := report(10), report(40)
	Comment(small) // the union of the secrets is made once per report: leave it out
	Comment(large)
	var smallOut, largeOut string
	smallAlloc := planAllocated(func() { smallOut = Comment(small) })
	largeAlloc := planAllocated(func() { largeOut = Comment(large) })
	if !strings.Contains(largeOut, "Per-stack detail left out") || !strings.Contains(smallOut, "Per-stack detail left out") {
		t.Fatal("the comments keep per-stack detail; the test would prove nothing")
	}
	if largeAlloc > smallAlloc*3/2 {
		t.Errorf("the comment of 40 stacks allocated %d bytes, of 10 stacks %d: its cost grows with the stacks, not its size", largeAlloc, smallAlloc)
	}
}

// The headings name the environment and its directory, and the caller's notes stay whole at
// every level of detail, right after the totals, scrubbed of the plan's secrets.
func TestHeadingsAndNotes(t *testing.T) {
	s := &Stack{Name: "stacks/prod/db", Class: events.ClassMutating, Counts: Counts{Update: 1}}
	for i := range 3000 {
		s.Changes = append(s.Changes, Change{Address: fmt.Sprintf("terraform_data.r%04d", i), Action: ActionUpdate})
	}
	r := &Report{Stacks: []*Stack{s}, Environment: "prod", Dir: "stacks/prod", Notes: []string{"**Gates:** one note", "second note\n"}}
	for name, out := range map[string]string{"summary": Markdown(r), "comment": fitMarkdown(r, 2000)} {
		if !strings.HasPrefix(out, "### tfstackplan: `prod` in `stacks/prod` — 🟡 mutating\n\n**Totals:** ") {
			t.Errorf("%s heading:\n%.200s", name, out)
		}
		if !strings.Contains(out, "\n\n**Gates:** one note\n\nsecond note\n\n") {
			t.Errorf("%s lost its notes:\n%.400s", name, out)
		}
	}
	r.Dir = ""
	if out := Markdown(r); !strings.HasPrefix(out, "### tfstackplan: `prod` in the repository's root — ") {
		t.Errorf("root heading:\n%.200s", out)
	}
	var b strings.Builder
	if err := Text(&b, r, false); err != nil || !strings.HasPrefix(b.String(), "tfstackplan: prod in the repository's root: mutating\n") {
		t.Errorf("text heading (%v):\n%.200s", err, b.String())
	}
}
