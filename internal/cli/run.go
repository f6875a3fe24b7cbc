package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tfstackplan/tfstackplan/internal/job"
	"github.com/tfstackplan/tfstackplan/runner"
)

// RunOptions are the options of `tfstackplan run plan` and `run apply`: the runner's options
// plus what only a process has (signals, the terramate binary).
type RunOptions struct {
	IO *IO
	// Run is passed to job.Run; the command fills Op, the flags and the streams.
	Run job.RunOptions
	// Changed and All select the stacks (--changed is the default).
	Changed, All bool
	// TerramateBin is the terramate binary ("" : terramate on PATH).
	TerramateBin string
	// Signals delivers SIGINT/SIGTERM (nil: the process's, through signal.Notify).
	Signals <-chan os.Signal
	// Exit ends the process at once on a third signal (os.Exit when nil).
	Exit func(code int)
	// InterruptGrace is how long terramate's group gets to stop after the first signal before
	// it is killed (--interrupt-grace; 0: runner.DefaultInterruptGrace).
	InterruptGrace time.Duration
}

func newRunCmd(ios *IO) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "The CI job: plan or apply the changed stacks of an environment, check drift, report ticks",
		Long: "run plan and run apply run terramate scripts over the changed stacks of one environment,\n" +
			"classify each stack's plan, report live progress to the control plane and write a result\n" +
			"document; run apply applies only after the gate allows it. run drift plans every stack on a\n" +
			"schedule and records which drifted. run tick is called by the scripts between phases.",
	}
	cmd.AddCommand(newRunOpCmd(ios, job.OpPlan, nil), newRunOpCmd(ios, job.OpApply, nil), newMergeCmd(ios, nil), newDriftCmd(ios, nil), newTickCmd(ios, nil))
	return cmd
}

// newRunOpCmd is `run plan` or `run apply` (op). runF runs the parsed options (nil: runRun);
// tests pass their own to see what the flags parse into without running anything.
func newRunOpCmd(ios *IO, op string, runF func(context.Context, *RunOptions) error) *cobra.Command {
	opts := &RunOptions{IO: ios}
	opts.Run.Op = op
	var short, long string
	if op == job.OpPlan {
		short = "Plan the changed stacks of an environment, classify and report them"
		long = "run plan runs the environment's plan script (terramate script run [--changed] plan) over\n" +
			"its changed stacks, in dependency order and in parallel, tails each stack's log to the\n" +
			"server, classifies each stack's plan JSON (destructive changes loud), finalizes the\n" +
			"execution and writes the result document, the step summary, the PR comment file and\n" +
			"the job outputs. Exit 0 when every stack planned, 1 when one failed, 2 on bad usage."
	} else {
		short = "Re-plan, check the gate, and apply the saved plans"
		long = "run apply runs the plan script again (fresh saved plans), classifies and hashes them,\n" +
			"and asks the server's gate with every changed stack's plan hash. Only when the gate\n" +
			"allows it does the apply script run (applying the saved plans, never re-planning), with\n" +
			"the leased service account in TFSTACKPLAN_REQUESTER and GOOGLE_IMPERSONATE_SERVICE_ACCOUNT;\n" +
			"the lease is revoked afterwards on every path. Exit 3 when the gate denies."
	}
	cmd := &cobra.Command{
		Use:   op + " --environment ENV [flags]",
		Short: short,
		Long:  long,
		Args:  runArgs(ios, op),
		RunE: func(cmd *cobra.Command, args []string) error {
			if opts.Changed && opts.All {
				return writeUsageResult(ios, op, errors.New("--changed and --all exclude each other"))
			}
			if err := checkInterruptGrace(ios, op, opts.InterruptGrace); err != nil {
				return err
			}
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			tuneDriver()
			return runRun(cmd.Context(), opts)
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return writeUsageResult(ios, op, err)
	})
	f := cmd.Flags()
	r := &opts.Run
	addRunFlags(f, opts, op)
	f.BoolVar(&opts.Changed, "changed", false, "run the changed stacks only (the default)")
	f.BoolVar(&opts.All, "all", false, "run every stack under the directory, changed or not")
	f.StringVar(&r.Base, "base", "", "git `REF` changes are computed against (default: terramate's)")
	f.StringVar(&r.CommentFile, "comment-file", "", "write the PR comment markdown here (default in Actions: $RUNNER_TEMP/tfstackplan-comment-ENV.md)")
	f.BoolVar(&r.DryRun, "dry-run", false, "print what terramate would run; run nothing, report nothing")
	f.IntVar(&r.PR, "pr", 0, "pull request number (default: from the GitHub event)")
	f.StringVar(&r.ForceUnlock, "force-unlock", "", "state lock `ID` the scripts force-unlock after init (TFSTACKPLAN_FORCE_UNLOCK)")
	if op == job.OpPlan {
		f.BoolVar(&r.RerunFailed, "rerun-failed", false, "plan again only the stacks the pull request's latest plan of the environment did not plan (failed, cancelled, not run) and what runs after them; carry the others' outcomes")
	}
	return cmd
}

// runArgs refuses arguments to a run command, with a usage result document.
func runArgs(ios *IO, op string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := cobra.NoArgs(cmd, args); err != nil {
			return writeUsageResult(ios, op, err)
		}
		return nil
	}
}

// addRunFlags adds the flags `run plan`, `run apply` and `run drift` share. Where a flag's
// meaning differs a little for drift (a drift run applies nothing, and checks every stack),
// its help and default say so.
func addRunFlags(f *pflag.FlagSet, opts *RunOptions, op string) {
	r := &opts.Run
	script, planOut, sha, grace := op, "write and apply", "commit the plan is for (default: the pull request's head, else GITHUB_SHA)",
		"after the first SIGINT/SIGTERM, how long tofu gets to stop and release its state lock before terramate's processes are killed (sized for GitHub's cancel: SIGINT, SIGTERM 7.5s later, SIGKILL 2.5s after that)"
	continueOnError, continueHelp := false, "keep running the other stacks after one fails"
	if op == job.OpDrift {
		script, planOut, sha = "plan", "write", "commit the configuration is at (default: GITHUB_SHA, else git's HEAD)"
		grace = "after the first SIGINT/SIGTERM, how long tofu gets to stop and release its state lock before terramate's processes are killed"
		continueOnError, continueHelp = true, "keep checking the other stacks after one fails (--continue-on-error=false stops at the first)"
	}
	f.StringVarP(&r.Environment, "environment", "e", "", "the environment (a block of tfstackplan.hcl; required)")
	f.StringVar(&r.Dir, "dir", "", "the terramate directory to run in (default: the environment's `dir`)")
	f.IntVar(&r.Parallel, "parallel", 0, "stacks run at once, in dependency order (default: terramate's)")
	f.StringVar(&r.Script, "script", "", "the terramate script to run (default: the environment's "+script+"_script)")
	f.StringVar(&r.LogFile, "log-file", "", "per-stack log file the scripts write and the pump tails (default tfstackplan.log)")
	f.StringVar(&r.PlanJSON, "plan-file", "", "per-stack plan JSON the scripts write (default tfstackplan.plan.json)")
	f.StringVar(&r.PlanOut, "plan-out", "", "per-stack saved plan file the scripts "+planOut+" (default "+job.DefaultPlanOutFile+")")
	f.StringVar(&r.ResultPath, "result", "", "where the result document goes (default $RUNNER_TEMP/tfstackplan-result.json in Actions, else ./tfstackplan-result.json)")
	f.BoolVar(&r.ContinueOnError, "continue-on-error", continueOnError, continueHelp)
	f.StringVar(&r.SHA, "sha", "", sha)
	f.StringVar(&r.Repo, "repo", "", "the repository, `OWNER/NAME` (default: GITHUB_REPOSITORY, else the git remote origin's)")
	f.StringVar(&r.LockTimeout, "lock-timeout", "", "state lock timeout passed to the scripts as TFSTACKPLAN_LOCK_TIMEOUT (default 0s)")
	f.StringVar(&r.ExecutionID, "execution", "", "the execution `ID` to report into (default: a new random id; a shard job: the matrix job's `execution` output)")
	f.IntVar(&r.Matrix, "matrix", 0, "fan out: cut the stacks into at most `N` shards along their dependency chains, announce the execution, print the GitHub matrix on stdout and run nothing")
	f.StringVar(&r.Shard, "shard", "", "fan out: run only shard `K/N` of the cut, into the matrix job's execution, without finalizing it (run merge does)")
	f.StringVar(&r.MatrixResult, "matrix-result", "", "a shard job: the matrix job's result document `FILE`, whose cut (and execution) it takes")
	f.StringVar(&opts.TerramateBin, "terramate", "", "the terramate binary (default: terramate on PATH)")
	f.DurationVar(&opts.InterruptGrace, "interrupt-grace", runner.DefaultInterruptGrace, grace)
}

// maxInterruptGrace bounds --interrupt-grace: a cancelled job must end.
const maxInterruptGrace = 10 * time.Minute

// checkInterruptGrace checks --interrupt-grace: out of range, it is a usage error, with its
// result document.
func checkInterruptGrace(ios *IO, op string, grace time.Duration) error {
	if grace <= 0 || grace > maxInterruptGrace {
		return writeUsageResult(ios, op, fmt.Errorf("--interrupt-grace %s: must be more than 0s and at most %s", grace, maxInterruptGrace))
	}
	return nil
}

// tuneDriver tunes the runtime for the driver (driverMaxProcs, driverGCPercent).
func tuneDriver() {
	if n, ok := driverMaxProcs(os.Getenv); ok {
		runtime.GOMAXPROCS(n)
	}
	if n, ok := driverGCPercent(os.Getenv); ok {
		debug.SetGCPercent(n)
	}
}

// driverMaxProcs is how many threads may run the driver's own Go code at once (GOMAXPROCS)
// during `run plan|apply`, and whether to set it: one, unless the GOMAXPROCS environment
// variable chooses. The driver supervises: it waits on terramate, tails logs and posts
// events, and the CI job's CPU belongs to the scripts it runs. With one P the runtime
// neither spins a second thread looking for work at every wake-up nor steals between
// queues; on the 200-stack benchmark that is about a sixth less driver CPU and a third fewer
// context switches, with the same log latency (BenchmarkPumpLatency -cpu 1,2). The work that
// could use more cores, classifying plans, runs one plan at a time anyway.
func driverMaxProcs(getenv func(string) string) (n int, set bool) {
	if getenv("GOMAXPROCS") != "" {
		return 0, false
	}
	return 1, true
}

// driverGCPercent is the driver's garbage-collection target (GOGC) during `run plan|apply`, and
// whether to set it: 200, unless the GOGC environment variable chooses. The driver lives for one
// job and keeps little for long (a 1,000-stack run peaks near 45 MB at the default of 100):
// twice the default takes a 200-stack run from 6 or 7 collections to 2, and its GC from 26-38
// to 12-19 ms of CPU (gctrace; about 200 ms in all), which the scripts get back, for about 9 MB
// more at 1,000 stacks (46 to 55 MB peak RSS). Set in-process, it leaves terramate and the
// scripts their own defaults.
func driverGCPercent(getenv func(string) string) (n int, set bool) {
	if getenv("GOGC") != "" {
		return 0, false
	}
	return 200, true
}

// writeUsageResult writes a result document of kind usage (the run never started) and returns
// the usage error.
func writeUsageResult(ios *IO, op string, err error) error {
	getenv := os.Getenv
	path := resultFlag(ios.Args)
	if path == "" {
		path = job.DefaultResultPath(getenv)
	}
	now := time.Now().UTC()
	res := &job.Result{
		Version: job.ResultVersion, Op: op, Status: job.StatusFailed, StartedAt: now, FinishedAt: now,
		Timings: map[string]int64{}, Stacks: []job.StackEntry{},
		Error: &job.ResultError{Kind: job.KindUsage, Step: "flags", Tail: err.Error()},
	}
	if werr := job.WriteResult(path, res); werr != nil {
		fmt.Fprintln(ios.ErrOut, "tfstackplan: error: could not write the result document:", werr)
	}
	return &UsageError{Err: err}
}

// resultFlag finds --result in the raw arguments (flag parsing may have stopped before it).
func resultFlag(args []string) string {
	for i, a := range args {
		if a == "--" {
			break
		}
		if v, ok := strings.CutPrefix(a, "--result="); ok {
			return v
		}
		if a == "--result" && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// runRun runs the job, forwarding the first SIGINT/SIGTERM to terramate's process group (the
// run then drains, finalizes, revokes and writes its result). terramate's group is killed when
// the interrupt grace ends; a second signal changes nothing (GitHub follows its SIGINT with a
// SIGTERM 7.5 s later as a matter of course), and a third kills everything and exits at once.
func runRun(ctx context.Context, opts *RunOptions) error {
	return resultError(runResult(ctx, opts))
}

// runResult is runRun's run, returning its result document.
func runResult(ctx context.Context, opts *RunOptions) *job.Result {
	if ctx == nil {
		ctx = context.Background()
	}
	r := opts.Run
	r.All = opts.All
	r.Stdout, r.Stderr = opts.IO.Out, opts.IO.ErrOut
	procs := &runner.ProcessGroups{}
	tm := &runner.Terramate{Bin: opts.TerramateBin, Procs: procs}
	if r.Terramate != nil {
		t := *r.Terramate
		t.Procs = procs
		tm = &t
	}
	tm.InterruptGrace = cmp.Or(opts.InterruptGrace, runner.DefaultInterruptGrace)
	r.Terramate = tm
	r.Terminal = isTerminal(opts.IO.Out)
	r.Color = r.Terminal && os.Getenv("NO_COLOR") == ""

	sigs := opts.Signals
	if sigs == nil {
		ch := make(chan os.Signal, 2)
		signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
		defer signal.Stop(ch)
		sigs = ch
	}
	exit := opts.Exit
	if exit == nil {
		exit = os.Exit
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan struct{})
	defer close(done)
	go func() {
		received := 0
		for {
			select {
			case <-done:
				return
			case s := <-sigs:
				received++
				switch received {
				case 1:
					fmt.Fprintf(opts.IO.ErrOut, "tfstackplan: %s: stopping terramate (killed after %s), then finalizing (a third signal kills at once)\n", s, tm.InterruptGrace)
					cancel(runner.SignalCause{Signal: s})
					continue
				case 2:
					fmt.Fprintf(opts.IO.ErrOut, "tfstackplan: %s: still stopping terramate (a third signal kills at once)\n", s)
					continue
				}
				procs.Kill()
				code := ExitFailure
				if n, ok := s.(syscall.Signal); ok {
					code = 128 + int(n)
				}
				exit(code)
				return
			}
		}
	}()

	return job.Run(ctx, r)
}

// resultError maps a run's result onto the error Main turns into the exit code.
func resultError(res *job.Result) error {
	e := res.Error
	if e == nil {
		return nil
	}
	err := errors.New(e.Kind + " error in " + e.Step + ": " + firstLine(e.Tail))
	switch e.Kind {
	case job.KindUsage:
		return &UsageError{Err: err}
	case job.KindGate:
		return fmt.Errorf("%w: %s", ErrGateDenied, firstLine(e.Tail))
	case job.KindCancelled:
		if res.Signal != nil {
			return &SignalError{Signal: res.Signal}
		}
	}
	return err
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// TickOptions are the options of `tfstackplan run tick`.
type TickOptions struct {
	IO   *IO
	Tick runner.TickOptions
}

// newTickCmd is `run tick`. runF runs the parsed options (nil: runTick); tests pass their own
// to see what the flags parse into without running anything.
func newTickCmd(ios *IO, runF func(context.Context, *TickOptions) error) *cobra.Command {
	opts := &TickOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "tick --phase PHASE [--stack STACK] [--status STATUS]",
		Short: "Report that the current stack entered a phase (called from the scripts)",
		Long: "tick reports one phase of one stack (default: TFSTACKPLAN_STACK). Under run plan|apply it\n" +
			"hands the tick to the driver and returns at once; offline it does nothing. It never\n" +
			"fails because of the server.",
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return runTick(cmd.Context(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Tick.Phase, "phase", "", "the phase the stack enters (init, plan, show, apply, done, ...)")
	f.StringVar(&opts.Tick.Stack, "stack", "", "the stack (default: TFSTACKPLAN_STACK)")
	f.StringVar(&opts.Tick.Status, "status", "", "a status for the phase (succeeded, failed, ...)")
	f.StringVar(&opts.Tick.Message, "message", "", "a short message")
	return cmd
}

func runTick(ctx context.Context, opts *TickOptions) error {
	if ctx == nil {
		ctx = context.Background()
	}
	warning, err := runner.Tick(ctx, opts.Tick)
	if err != nil {
		return &UsageError{Err: err}
	}
	if warning != "" {
		fmt.Fprintln(opts.IO.ErrOut, "tfstackplan: warning:", warning)
	}
	return nil
}
