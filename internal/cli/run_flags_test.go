package cli

import (
	"context"
	"io"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/job"
	"github.com/tfstackplan/tfstackplan/runner"
)

// parse runs cmd over args with its runF capturing, and fails the test when it errs.
func parse(t *testing.T, cmd interface {
	SetArgs([]string)
	Execute() error
}, args ...string) {
	t.Helper()
	cmd.SetArgs(args)
	if err := cmd.Execute(); err != nil {
		t.Fatalf("%q: %v", args, err)
	}
}

func quietIO(t *testing.T) *IO {
	// A usage error writes a result document: keep it in the test's directory.
	return &IO{Out: io.Discard, ErrOut: io.Discard, Args: []string{"--result", filepath.Join(t.TempDir(), "r.json")}}
}

// The flags plan, apply and drift share parse the same way into the job's options; the
// defaults of what differs for drift (every stack, keep going) are its own.
func TestRunFlagsParse(t *testing.T) {
	shared := []string{"-e", "prod", "--dir", "stacks/prod", "--parallel", "4", "--script", "s", "--log-file", "l.log",
		"--plan-file", "p.json", "--plan-out", "p.tfplan", "--result", "r.json", "--sha", "abc", "--repo", "o/r",
		"--lock-timeout", "30s", "--execution", "ex", "--shard", "2/3", "--matrix-result", "m.json",
		"--terramate", "/bin/tm", "--interrupt-grace", "9s"}
	check := func(t *testing.T, o *RunOptions, op string) {
		t.Helper()
		r := o.Run
		got := []string{r.Op, r.Environment, r.Dir, r.Script, r.LogFile, r.PlanJSON, r.PlanOut, r.ResultPath, r.SHA, r.Repo,
			r.LockTimeout, r.ExecutionID, r.Shard, r.MatrixResult, o.TerramateBin}
		want := []string{op, "prod", "stacks/prod", "s", "l.log", "p.json", "p.tfplan", "r.json", "abc", "o/r",
			"30s", "ex", "2/3", "m.json", "/bin/tm"}
		if !slices.Equal(got, want) || r.Parallel != 4 || o.InterruptGrace != 9*time.Second {
			t.Errorf("%s: got %q, parallel %d, grace %s; want %q, 4, 9s", op, got, r.Parallel, o.InterruptGrace, want)
		}
	}
	for _, op := range []string{job.OpPlan, job.OpApply} {
		var got *RunOptions
		cmd := newRunOpCmd(quietIO(t), op, func(_ context.Context, o *RunOptions) error { got = o; return nil })
		parse(t, cmd, append(shared, "--all", "--base", "main", "--pr", "7", "--dry-run", "--comment-file", "c.md", "--force-unlock", "L1")...)
		check(t, got, op)
		r := got.Run
		if !got.All || r.Base != "main" || r.PR != 7 || !r.DryRun || r.CommentFile != "c.md" || r.ForceUnlock != "L1" || r.ContinueOnError {
			t.Errorf("%s: all %v, base %q, pr %d, dry-run %v, comment %q, force-unlock %q, continue %v", op, got.All, r.Base, r.PR, r.DryRun, r.CommentFile, r.ForceUnlock, r.ContinueOnError)
		}
	}
	var drift *DriftOptions
	cmd := newDriftCmd(quietIO(t), func(_ context.Context, o *DriftOptions) error { drift = o; return nil })
	parse(t, cmd, append(shared, "--issue-file", "i.md", "--fail-on-drift")...)
	check(t, &drift.RunOptions, job.OpDrift)
	if !drift.All || !drift.Run.ContinueOnError || !drift.FailOnDrift || drift.Run.IssueFile != "i.md" {
		t.Errorf("drift: all %v, continue %v, fail-on-drift %v, issue %q; want every stack, keep going, fail, i.md",
			drift.All, drift.Run.ContinueOnError, drift.FailOnDrift, drift.Run.IssueFile)
	}
}

// Flags that exclude each other, or a grace out of range, are usage errors before anything runs.
func TestRunFlagsRefused(t *testing.T) {
	ran := false
	runF := func(context.Context, *RunOptions) error { ran = true; return nil }
	for _, args := range [][]string{
		{"-e", "prod", "--changed", "--all"},
		{"-e", "prod", "--interrupt-grace", "0s"},
		{"-e", "prod", "extra"},
		{"--no-such-flag"},
	} {
		cmd := newRunOpCmd(quietIO(t), job.OpPlan, runF)
		cmd.SetArgs(args)
		cmd.SilenceErrors, cmd.SilenceUsage = true, true
		if err := cmd.Execute(); ExitCode(err) != ExitUsage {
			t.Errorf("%q: %v (exit %d), want a usage error", args, err, ExitCode(err))
		}
	}
	if ran {
		t.Error("a refused command ran")
	}
	if got := newRunOpCmd(quietIO(t), job.OpPlan, runF).Flags().Lookup("interrupt-grace").DefValue; got != runner.DefaultInterruptGrace.String() {
		t.Errorf("interrupt-grace defaults to %s", got)
	}
}

// run merge takes the matrix document, the shards' documents and where its outputs go.
func TestMergeFlagsParse(t *testing.T) {
	var got *MergeOptions
	cmd := newMergeCmd(quietIO(t), func(_ context.Context, o *MergeOptions) error { got = o; return nil })
	parse(t, cmd, "--matrix", "m.json", "--result", "r.json", "--comment-file", "c.md", "--issue-file", "i.md", "s1.json", "s2.json")
	m := got.Merge
	if m.Matrix != "m.json" || m.ResultPath != "r.json" || m.CommentFile != "c.md" || m.IssueFile != "i.md" || !slices.Equal(m.Shards, []string{"s1.json", "s2.json"}) {
		t.Errorf("merge options %+v", m)
	}
}

// run tick takes the phase, the stack, its status and a message.
func TestTickFlagsParse(t *testing.T) {
	var got *TickOptions
	cmd := newTickCmd(quietIO(t), func(_ context.Context, o *TickOptions) error { got = o; return nil })
	parse(t, cmd, "--phase", "plan", "--stack", "stacks/a", "--status", "failed", "--message", "m")
	if k := got.Tick; k.Phase != "plan" || k.Stack != "stacks/a" || k.Status != "failed" || k.Message != "m" {
		t.Errorf("tick options %+v", k)
	}
}
