package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tfstackplan/tfstackplan/internal/job"
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

// newDriftCmd is `run drift`. runF runs the parsed options (nil: the drift run); tests pass
// their own to see what the flags parse into without running anything.
func newDriftCmd(ios *IO, runF func(context.Context, *DriftOptions) error) *cobra.Command {
	opts := &DriftOptions{RunOptions: RunOptions{IO: ios}}
	opts.Run.Op = job.OpDrift
	op := job.OpDrift
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
		Args: runArgs(ios, op),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkInterruptGrace(ios, op, opts.InterruptGrace); err != nil {
				return err
			}
			opts.All = true
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			tuneDriver()
			return driftError(runResult(cmd.Context(), &opts.RunOptions), opts.FailOnDrift)
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return writeUsageResult(ios, op, err)
	})
	f := cmd.Flags()
	addRunFlags(f, &opts.RunOptions, op)
	f.StringVar(&opts.Run.IssueFile, "issue-file", "", "write the drift issue body markdown here (the drifted stacks and their changes, masked)")
	f.BoolVar(&opts.FailOnDrift, "fail-on-drift", false, "exit 4 when a stack drifted (default: exit 0 either way)")
	return cmd
}

// driftError maps a drift run's result onto the error Main turns into the exit code: the run's
// own failure first (a failed stack fails the run as in run plan), then, with failOnDrift,
// drift.
func driftError(res *job.Result, failOnDrift bool) error {
	if err := resultError(res); err != nil {
		return err
	}
	if failOnDrift && res.Drift != nil && res.Drift.HasDrift {
		return fmt.Errorf("%w: %d stacks drifted (--fail-on-drift)", ErrDrift, len(res.Drift.Drifted))
	}
	return nil
}
