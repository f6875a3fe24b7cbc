package job

// This file is what `run drift` adds to `run plan`: the same flow over every stack of the
// environment (a plan refreshes, so it sees what changed outside), of no pull request, then
// per stack whether it drifted, the drift outputs and the issue body. The server records each
// stack's drift check at the execution's Finalize (op drift).

import (
	"fmt"
	"io"
	"strings"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/plan"
)

// DriftResult is what a drift run found: whether any stack drifted, and which.
type DriftResult struct {
	HasDrift bool `json:"has_drift"`
	// Drifted are the drifted stacks' repository paths, in the run's order.
	Drifted []string `json:"drifted"`
	// Checked is how many stacks planned, drifted or not; the others failed or did not run.
	Checked int `json:"checked"`
}

// planning reports whether the run's op plans its stacks as its own work (run plan, run
// drift), rather than as the check before an apply.
func (r *run) planning() bool { return r.o.Op == OpPlan || r.o.Op == OpDrift }

// setupDrift checks a drift run's options and sets what drift implies: every stack, no pull
// request. An op that is none of plan, apply and drift fails the run.
func (r *run) setupDrift() error {
	o := &r.o
	if o.Op != OpDrift {
		return newResultError(KindUsage, "config", fmt.Sprintf("unknown operation %q", o.Op))
	}
	if o.PR != 0 {
		return newResultError(KindUsage, "config", fmt.Sprintf("run drift is of no pull request, got pr %d", o.PR))
	}
	o.All = true
	return nil
}

// stackDrifted reports whether a classified plan shows drift: a change of any class (what the
// configuration would do to the infrastructure as it is now), or resource drift (what changed
// outside, even when no change follows from it).
func stackDrifted(s *plan.Stack) bool {
	if s == nil || s.Class == events.ClassUnclassified || s.Class == "" {
		return false
	}
	return s.Class != events.ClassNoChanges || s.DriftCount > 0
}

// markDrift records on a drift run's result which stacks drifted: those that planned and whose
// plan shows drift (stackDrifted).
func (r *run) markDrift() {
	if r.o.Op != OpDrift {
		return
	}
	d := &DriftResult{Drifted: []string{}}
	for i := range r.res.Stacks {
		e := &r.res.Stacks[i]
		drifted := e.Status == StatusSucceeded && stackDrifted(r.classed[e.Path])
		e.Drifted = &drifted
		if e.Status == StatusSucceeded {
			d.Checked++
		}
		if drifted {
			d.Drifted = append(d.Drifted, e.Path)
		}
	}
	d.HasDrift = len(d.Drifted) > 0
	r.res.Drift = d
}

// driftOutputs are a drift run's GitHub outputs: has-drift, drifted (the count) and, when
// written, issue-file.
func (r *run) driftOutputs() [][2]string {
	d := r.res.Drift
	if d == nil {
		return nil
	}
	kv := [][2]string{{"has-drift", fmt.Sprint(d.HasDrift)}, {"drifted", fmt.Sprint(len(d.Drifted))}}
	if r.o.IssueFile != "" {
		kv = append(kv, [2]string{"issue-file", r.o.IssueFile})
	}
	return kv
}

// driftSummary prints a drift run's outcome under the terminal summary.
func (r *run) driftSummary(w io.Writer) {
	d := r.res.Drift
	if d == nil {
		return
	}
	fmt.Fprintf(w, "drift: %d of %d stacks drifted", len(d.Drifted), len(r.res.Stacks))
	if n := len(r.res.Stacks) - d.Checked; n > 0 {
		fmt.Fprintf(w, " (%d not checked: failed or not run)", n)
	}
	fmt.Fprintln(w)
	for _, p := range d.Drifted {
		fmt.Fprintf(w, "  drifted    %s\n", plan.Printable(p))
	}
}

// writeIssueFile writes a drift run's issue body to RunOptions.IssueFile (when set).
func (r *run) writeIssueFile() {
	if r.o.Op != OpDrift || r.o.IssueFile == "" {
		return
	}
	if err := writeFileAtomic(r.o.IssueFile, []byte(r.issueBody()), 0o644); err != nil {
		r.warn("issue file: %v", err)
	}
}

// issueBody is the markdown of a drift run's issue: the environment, how many stacks drifted,
// and the drifted stacks rendered as the PR comment renders a plan (by repository path, with
// their changes and drift; masked the same way, never a sensitive value; within GitHub's size
// limit), with the link to the execution page when a server is configured.
func (r *run) issueBody() string {
	res := r.res
	rep := &plan.Report{Environment: res.Environment, Dir: r.tierRel, ExecutionURL: res.ExecutionURL}
	d := res.Drift
	if d == nil {
		d = &DriftResult{}
	}
	var note strings.Builder
	fmt.Fprintf(&note, "**Drift check** of environment %s: %d of %d stacks drifted", plan.CodeSpan(res.Environment), len(d.Drifted), len(res.Stacks))
	if res.SHA != "" {
		fmt.Fprintf(&note, " from the configuration at %s", plan.CodeSpan(res.SHA))
	}
	fmt.Fprintf(&note, " (%s).", res.StartedAt.UTC().Format("2006-01-02 15:04 MST"))
	if n := len(res.Stacks) - d.Checked; n > 0 {
		fmt.Fprintf(&note, " %s not checked (failed or not run).", plural(n, "stack was", "stacks were"))
	}
	if res.Error != nil {
		fmt.Fprintf(&note, " The run failed (%s error in %s).", res.Error.Kind, res.Error.Step)
	}
	rep.Notes = []string{note.String()}
	for _, p := range d.Drifted {
		if s := r.classed[p]; s != nil {
			rep.Stacks = append(rep.Stacks, s)
		}
	}
	return plan.Comment(rep)
}

// plural is "1 stack was" or "n stacks were".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
