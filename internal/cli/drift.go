package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tfstackplan/tfstackplan/runner"
)

// ErrDrift marks a drift run that found drift under --fail-on-drift: it exits ExitDrift.
var ErrDrift = errors.New("drift found")

// DriftOptions are the options of `tfstackplan run drift`: those of a run, and whether drift
// fails it.
type DriftOptions struct {
	RunOptions
	// FailOnDrift makes a run that found drift exit ExitDrift (without it, drift exits 0).
	FailOnDrift bool
}

func newDriftCmd(ios *IO) *cobra.Command {
	opts := &DriftOptions{RunOptions: RunOptions{IO: ios}}
	opts.Run.Op = runner.OpDrift
	op := runner.OpDrift
	cmd := &cobra.Command{
		Use:   "drift --environment ENV [flags]",
		Short: "Plan every stack of an environment and record which drifted (a scheduled job)",
		Long: "run drift runs the environment's plan script over every stack (a plan refreshes, so it\n" +
			"sees what changed outside the configuration), classifies each plan as run plan does and\n" +
			"records on the server, per stack, whether it drifted: its plan has changes or resource\n" +
			"drift. It takes no claims, needs no gates and concludes no check; it is of no pull\n" +
			"request. It writes the result document, the outputs has-drift and drifted, and with\n" +
			"--issue-file an issue body naming the drifted stacks. Exit 0 whether or not a stack\n" +
			"drifted, 4 when one did and --fail-on-drift is set, 1 when a stack failed to plan, 2 on\n" +
			"bad usage.",
		Args: func(cmd *cobra.Command, args []string) error {
			if err := cobra.NoArgs(cmd, args); err != nil {
				return writeUsageResult(ios, op, err)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := startDriver(ios, op, opts.InterruptGrace); err != nil {
				return err
			}
			opts.All = true
			return driftError(runResult(cmd.Context(), &opts.RunOptions), opts.FailOnDrift)
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return writeUsageResult(ios, op, err)
	})
	f := cmd.Flags()
	r := &opts.Run
	f.StringVarP(&r.Environment, "environment", "e", "", "the environment (a block of tfstackplan.hcl; required)")
	f.StringVar(&r.Dir, "dir", "", "the terramate directory to run in (default: the environment's `dir`)")
	f.IntVar(&r.Parallel, "parallel", 0, "stacks run at once, in dependency order (default: terramate's)")
	f.StringVar(&r.Script, "script", "", "the terramate script to run (default: the environment's plan_script)")
	f.StringVar(&r.LogFile, "log-file", "", "per-stack log file the scripts write and the pump tails (default tfstackplan.log)")
	f.StringVar(&r.PlanJSON, "plan-file", "", "per-stack plan JSON the scripts write (default tfstackplan.plan.json)")
	f.StringVar(&r.PlanOut, "plan-out", "", "per-stack saved plan file the scripts write (default "+runner.DefaultPlanOutFile+")")
	f.StringVar(&r.ResultPath, "result", "", "where the result document goes (default $RUNNER_TEMP/tfstackplan-result.json in Actions, else ./tfstackplan-result.json)")
	f.StringVar(&r.IssueFile, "issue-file", "", "write the drift issue body markdown here (the drifted stacks and their changes, masked)")
	f.BoolVar(&opts.FailOnDrift, "fail-on-drift", false, "exit 4 when a stack drifted (default: exit 0 either way)")
	f.BoolVar(&r.ContinueOnError, "continue-on-error", true, "keep checking the other stacks after one fails (--continue-on-error=false stops at the first)")
	f.StringVar(&r.SHA, "sha", "", "commit the configuration is at (default: GITHUB_SHA, else git's HEAD)")
	f.StringVar(&r.Repo, "repo", "", "the repository, `OWNER/NAME` (default: GITHUB_REPOSITORY, else the git remote origin's)")
	f.StringVar(&r.LockTimeout, "lock-timeout", "", "state lock timeout passed to the scripts as TFSTACKPLAN_LOCK_TIMEOUT (default 0s)")
	addFanOutFlags(f, r)
	f.StringVar(&opts.TerramateBin, "terramate", "", "the terramate binary (default: terramate on PATH)")
	f.DurationVar(&opts.InterruptGrace, "interrupt-grace", runner.DefaultInterruptGrace,
		"after the first SIGINT/SIGTERM, how long tofu gets to stop and release its state lock before terramate's processes are killed")
	return cmd
}

// driftError maps a drift run's result onto the error Main turns into the exit code: the run's
// own failure first (a failed stack fails the run as in run plan), then, with failOnDrift,
// drift.
func driftError(res *runner.Result, failOnDrift bool) error {
	if err := resultError(res); err != nil {
		return err
	}
	if failOnDrift && res.Drift != nil && res.Drift.HasDrift {
		return fmt.Errorf("%w: %d stacks drifted (--fail-on-drift)", ErrDrift, len(res.Drift.Drifted))
	}
	return nil
}
