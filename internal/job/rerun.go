package job

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/tfstackplan/tfstackplan/runner"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/plan"
)

// `run plan --rerun-failed`: plan again only what the PR's latest plan of the environment did
// not plan (its failed, cancelled, not-run and unclassified stacks, the stacks it did not have)
// and every stack that runs after one of them, and carry the others' outcomes (status, class,
// counts, content hash, destructive addresses) into the new execution. The new execution is
// then the PR's latest plan, with the same content hashes for the carried stacks: an approval
// of that content still covers it, and the apply compares its fresh plans with these hashes.

// selectRerun reads the PR's latest plan and narrows what runs. Anything that makes the
// carried outcomes doubtful (no server, no earlier plan, another commit, a plan still running)
// plans every stack instead, with a warning.
func (r *run) selectRerun(ctx context.Context) error {
	r.begin("rerun")
	all := func(format string, a ...any) error {
		r.warn("--rerun-failed: "+format+"; every stack is planned", a...)
		return nil
	}
	switch {
	case !r.client.Enabled():
		return all("no server to read the pull request's latest plan from")
	case r.o.PR <= 0:
		return all("no pull request (--pr, or a pull_request event)")
	}
	prev, err := r.client.LatestExecution(ctx, r.o.Repo, r.o.Environment, r.o.PR, OpPlan)
	switch {
	case errors.Is(err, runner.ErrNoExecution):
		return all("PR #%d has no earlier plan of %s", r.o.PR, r.o.Environment)
	case err != nil:
		return all("the pull request's latest plan could not be read: %v", err)
	case prev.Status == events.ExecutionRunning:
		return all("the pull request's latest plan %s is still running", prev.ExecutionID)
	case prev.SHA != r.o.SHA:
		return all("the pull request's latest plan %s is of commit %s, this run of %s", prev.ExecutionID, shortSHA(prev.SHA), shortSHA(r.o.SHA))
	}
	before := map[string]api.StackState{}
	for _, st := range prev.Stacks {
		before[st.Stack] = st
	}
	again := map[string]bool{}
	for _, p := range r.paths {
		st, ok := before[p]
		if !ok || st.Status != api.StackStatusSucceeded || st.PlanHash == "" || st.Class == "" || st.Class == events.ClassUnclassified {
			again[p] = true
		}
	}
	// What runs after a stack planned again is planned again too: its plan may read the
	// other's outputs.
	again = newGraph(r.paths, r.rootEdges()).withAfter(again)
	r.carried = map[string]api.StackState{}
	for _, p := range r.paths {
		if !again[p] {
			r.carried[p] = before[p]
		}
	}
	r.res.RerunOf = prev.ExecutionID
	r.subset = true
	fmt.Fprintf(r.errOut, "tfstackplan: --rerun-failed: %d of %d stacks planned again, %d carried from %s\n", len(again), len(r.paths), len(r.carried), prev.ExecutionID)
	return nil
}

// toRun returns the stacks (as listed) whose scripts run: all but the carried ones.
func (r *run) toRun() []string {
	if len(r.carried) == 0 {
		return r.listed
	}
	out := make([]string, 0, len(r.listed))
	for i, l := range r.listed {
		if _, ok := r.carried[r.paths[i]]; !ok {
			out = append(out, l)
		}
	}
	return out
}

// carry is the classification a carried stack takes from the earlier plan: its class, counts
// and content hash (its changes are on that plan's page; the destructive addresses go in the
// result and the update).
func (r *run) carry(p string, st api.StackState) *plan.Stack {
	c := st.Counts
	return &plan.Stack{
		Name: p, Class: st.Class, PlanHash: st.PlanHash, Destructive: []plan.Change{}, Changes: []plan.Change{},
		Counts: plan.Counts{Create: c.Create, Update: c.Update, Replace: c.Replace, Delete: c.Delete, Forget: c.Forget, Import: c.Import, Read: c.Read},
	}
}

// carriedNote is the report's section on the carried stacks ("" when none).
func (r *run) carriedNote() string {
	if len(r.carried) == 0 {
		return ""
	}
	names := make([]string, 0, len(r.carried))
	for _, p := range r.paths {
		if _, ok := r.carried[p]; ok {
			names = append(names, p)
		}
	}
	slices.Sort(names)
	return fmt.Sprintf("**Carried from plan %s** (`--rerun-failed`): %s kept the outcome and content hash that plan gave them, and were not planned again; their changes are on that plan's page.\n",
		plan.CodeSpan(r.res.RerunOf), someNames(names, plan.CodeSpan))
}

// shortSHA is a commit's first 12 characters ("(none)" for none).
func shortSHA(sha string) string {
	if sha == "" {
		return "(none)"
	}
	return sha[:min(len(sha), 12)]
}

// rerunUsage checks --rerun-failed against the other options ("" : fine).
func rerunUsage(o *RunOptions) string {
	switch {
	case !o.RerunFailed:
		return ""
	case o.Op != OpPlan:
		return "--rerun-failed re-plans a pull request's plan: it is for run plan"
	case o.Matrix > 0 || o.Shard != "":
		return "--rerun-failed and a fan-out (--matrix, --shard) do not go together"
	case o.All:
		return "--rerun-failed takes the stacks of the pull request's latest plan: drop --all"
	}
	return ""
}
