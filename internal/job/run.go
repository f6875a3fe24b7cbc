package job

// This file is the CI job's frame: Run runs the op's steps (planSteps in plan.go, applySteps
// in apply.go) until one fails, then finish sets the outcome once and ends the job.
//
//	setup → discover → [select] → announce (Init, pump) → plan script run → drain → classify
//	  (apply: → gate check → apply script run → revoke) → finish: Finalize → outputs
//
// Every path ends in Finalize (success, failure, cancel, a recovered panic), so no execution is
// left running on the server, and in a result document. Reporting is best-effort throughout;
// only the gate check decides anything, and it fails closed.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"time"

	"github.com/tfstackplan/tfstackplan/runner"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/plan"
)

// Defaults of a run.
const (
	DefaultPlanOutFile = "tfstackplan.tfplan" // the saved (binary) plan the scripts write
	DefaultLockTimeout = "0s"
	// DrainBudget bounds how long a run waits for the log pump after terramate returns.
	DrainBudget = 10 * time.Second
	// CancelDrainBudget bounds the same wait after a signal.
	CancelDrainBudget = 3 * time.Second
	// UnreachableDrainBudget bounds it while the client's breaker is open (a dead server).
	UnreachableDrainBudget = 200 * time.Millisecond
	// CleanupBudget bounds Finalize and GateRevoke after the run's context ended.
	CleanupBudget = 5 * time.Second
	// HeartbeatInterval is how often a run tells the server it goes on.
	HeartbeatInterval = 30 * time.Second
)

// Variables a run exports to terramate and so to every script command (see scripts/terramate).
const (
	EnvOp          = "TFSTACKPLAN_OP"           // plan, apply or drift
	EnvLogFile     = "TFSTACKPLAN_LOG_FILE"     // per-stack log file name
	EnvPlanOut     = "TFSTACKPLAN_PLAN_OUT"     // per-stack saved plan file name
	EnvPlanJSON    = "TFSTACKPLAN_PLAN_JSON"    // per-stack plan JSON file name
	EnvLockTimeout = "TFSTACKPLAN_LOCK_TIMEOUT" // -lock-timeout for plan and apply
	EnvForceUnlock = "TFSTACKPLAN_FORCE_UNLOCK" // a lock ID to force-unlock after init
	EnvRequester   = "TFSTACKPLAN_REQUESTER"    // apply: the service account the gate leased
	// EnvImpersonate is read by Google's client libraries, gcloud and the google provider.
	EnvImpersonate = "GOOGLE_IMPERSONATE_SERVICE_ACCOUNT"
)

// Operations of a run (RunOptions.Op).
const (
	OpPlan  = string(events.OpPlan)
	OpApply = string(events.OpApply)
	// OpDrift is `run drift`: the plan script over every stack, recording drift (drift.go).
	OpDrift = string(events.OpDrift)
)

// RunOptions are the inputs of `run plan` and `run apply`. Zero values take the
// tfstackplan.hcl environment block's settings, then the defaults.
type RunOptions struct {
	Op          string // OpPlan, OpApply or OpDrift
	Environment string
	// Dir is the terramate directory (tier) to run in, relative to WorkDir; "" takes the
	// environment's `dir`, relative to the repository root.
	Dir string
	// WorkDir is the directory the run starts from ("" : the process's working directory).
	WorkDir string
	// All runs every stack under Dir instead of the changed ones.
	All  bool
	Base string // the git ref changes are computed against ("" : terramate's default)
	// Parallel is terramate's --parallel (0: terramate's default, one at a time).
	Parallel int
	// Script overrides the op's script name (plan_script for plan, apply_script for apply).
	Script          string
	LogFile         string // per-stack log file name
	PlanJSON        string // per-stack plan JSON file name
	PlanOut         string // per-stack saved plan file name
	ContinueOnError bool
	DryRun          bool
	LockTimeout     string
	ForceUnlock     string

	PR     int
	SHA    string
	Actor  string
	RunURL string
	// Repo is the repository, OWNER/NAME ("" : GITHUB_REPOSITORY, else the origin remote's); it
	// is checked and lower-cased. A run with a server but no repository reports nothing (an
	// apply is denied).
	Repo string

	// ResultPath is where the result document goes ("" : DefaultResultPath).
	ResultPath string
	// CommentFile receives the PR comment markdown ("" : not written, except in Actions where
	// it defaults to $RUNNER_TEMP/tfstackplan-comment-<environment>.md).
	CommentFile string
	// IssueFile receives a drift run's issue body markdown ("" : not written; run drift only).
	IssueFile string

	// Terramate runs terramate (nil: the `terramate` on PATH). Its Dir is set by the run.
	Terramate *runner.Terramate
	// Client is the control plane (nil: built with RunClient from the environment block).
	Client *runner.Client
	// Getenv reads the environment (os.Getenv when nil).
	Getenv func(string) string
	// Stdout receives terramate's output and the summary; Stderr warnings.
	Stdout, Stderr io.Writer
	// Color paints the terminal summary.
	Color bool
	// Terminal says Stdout is a terminal: the run prints a line per stack under a live status
	// line, and terramate's own output goes to a file (see jobLog).
	Terminal bool
	// ExecutionID names the execution ("" : a random id).
	ExecutionID string
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Pump tunes the log pump (zero: defaults).
	Pump runner.PumpOptions
	// TickRelay is how often ticks are relayed to the server (zero: TickRelayInterval).
	TickRelay time.Duration
	// Heartbeat is how often the run tells the server it goes on (zero: HeartbeatInterval).
	Heartbeat time.Duration

	// Matrix, when positive, makes the run a fan-out's first job: it discovers the stacks, cuts
	// them into at most Matrix shards (Cut), announces the execution every shard reports into,
	// prints the GitHub matrix on stdout and runs nothing.
	Matrix int
	// Shard, "K/N", runs only shard K of the cut into the execution the matrix job announced
	// (ExecutionID), without finalizing it (`run merge` does).
	Shard string
	// MatrixResult is the matrix job's result document: a shard takes its cut (and execution)
	// from it instead of cutting again by stack count.
	MatrixResult string
	// RerunFailed plans again only what the pull request's latest plan of the environment did
	// not plan, and what runs after it, carrying the other stacks' outcomes (rerun.go).
	RerunFailed bool
}

// run is the state of one run.
type run struct {
	o      RunOptions
	res    *Result
	getenv func(string) string
	now    func() time.Time
	out    io.Writer
	errOut io.Writer
	gh     GitHub
	head   *call[string] // git's answer for HEAD, when setup had to ask (awaitHead)

	root    runner.StackRoot // the repository's root (root.Dir(): absolute and symlink-free)
	tierAbs string           // absolute terramate directory
	tierRel string           // tierAbs relative to the root, "" at the root
	block   runner.Environment
	tm      *runner.Terramate
	script  string // the op's script
	planScr string // the plan script (apply runs it first)

	// discovered is what discovery found (discover.go); a shard or --rerun-failed narrows it.
	discovered
	// unnamed holds the stacks whose paths the server does not take as names
	// (events.NameProblem), with the problem: they are left out of what is reported.
	unnamed map[string]string
	// nextGens is where each stack's log goes on after a drained script run (the pump's
	// NextGenerations): run apply's apply script follows its plan script's logs.
	nextGens map[string]int64
	report   *plan.Report
	classed  map[string]*plan.Stack // root-relative → classification
	// early holds the stacks `run plan` classified and reported when they ticked done; only
	// the tick relay writes it, and only while the script runs.
	early map[string]*plan.Stack

	// reporter reports the execution to the control plane (its client is the run's).
	*reporter
	stepStart time.Time
	step      string
	// draining is the pump's drain under way (startDrain; one pump at a time), which drain
	// waits for.
	draining *pendingDrain
	// masker is the run's masks, shared with the log pump: the failed stacks' log tails are
	// masked with it.
	masker *runner.Masker
	// subset: the run's stacks are a part of what terramate would select (a shard), and the
	// scripts run stack by stack (ScriptRunStacks).
	subset bool
	// noFinalize: the execution is finalized by another job (a fan-out's merge).
	noFinalize bool
	// execGiven: the execution id was given (RunOptions.ExecutionID), not made up.
	execGiven bool
	// lease is the gate's lease the job holds until it revokes it (nil: none): run apply's
	// from its gate check, a fan-out apply's merge the one its shards shared.
	lease *lease
	// pump tails the stacks' logs while a script runs (nil: none), from announce until drained.
	pump *runner.LogPump
	// carried are the stacks --rerun-failed does not plan again, with what the earlier plan
	// said of them (by repository path).
	carried map[string]api.StackState
}

// Run runs `run plan` or `run apply` and returns its result document, already written to the
// result path (a failure to write it is recorded as a warning on the returned Result and
// printed). The result's Error says why the run failed; nil is success. Cancel ctx with a
// SignalCause to interrupt the run: terramate's process group gets the signal, and the run
// still drains, finalizes (cancelled), revokes the lease and writes the result.
func Run(ctx context.Context, o RunOptions) *Result {
	r := newRun(o)
	ctx, r.cancelRun = context.WithCancelCause(ctx)
	defer r.cancelRun(nil)
	err := r.do(ctx, r.steps())
	r.finish(ctx, err)
	return r.res
}

// step is one step of a job: it returns the error that ends the job (a *ResultError), or nil
// to go on.
type step func(ctx context.Context) error

// steps lists the steps of the run's op, in order (plan.go, apply.go). Whatever they end in,
// finish follows.
func (r *run) steps() []step {
	if r.o.Op == OpApply {
		return r.applySteps()
	}
	return r.planSteps() // run plan and run drift (setup refuses any other op)
}

// do runs steps in order until one fails, and returns its error. A panic in a step is the
// run's internal error, named after the step it happened in.
func (r *run) do(ctx context.Context, steps []step) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = newResultError(KindInternal, r.step, fmt.Sprintf("panic: %v\n%s", p, debug.Stack()))
		}
	}()
	for _, s := range steps {
		if err := s(ctx); err != nil {
			return err
		}
	}
	return nil
}

// discoverAndHead discovers the stacks, then records the commit git named for HEAD (setup
// asked while discovery ran).
func (r *run) discoverAndHead(ctx context.Context) error {
	err := r.discover(ctx)
	if headErr := r.awaitHead(); err == nil && headErr != nil {
		err = headErr
	}
	return err
}

func newRun(o RunOptions) *run {
	r := &run{o: o, getenv: o.Getenv, now: o.Now, out: o.Stdout, errOut: o.Stderr, early: map[string]*plan.Stack{}}
	if r.getenv == nil {
		r.getenv = os.Getenv
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.out == nil {
		r.out = io.Discard
	}
	if r.errOut == nil {
		r.errOut = io.Discard
	}
	r.reporter = &reporter{client: o.Client, execID: o.ExecutionID, every: o.Heartbeat, warnf: r.warn, clock: r.now}
	r.gh = GitHubFromEnv(r.getenv)
	if r.o.Pump.Masker == nil {
		r.o.Pump.Masker = runner.NewMasker()
	}
	r.masker = r.o.Pump.Masker
	start := r.now()
	r.res = &Result{
		Version: ResultVersion, Op: o.Op, Environment: o.Environment, Status: StatusSucceeded,
		DryRun: o.DryRun, StartedAt: start.UTC(), Timings: map[string]int64{}, Stacks: []StackEntry{},
	}
	r.stepStart, r.step = start, "config"
	return r
}

// begin starts timing a step; the previous step's time is recorded.
func (r *run) begin(step string) {
	now := r.now()
	r.res.Timings[r.step] += now.Sub(r.stepStart).Milliseconds()
	r.step, r.stepStart = step, now
}

func (r *run) warn(format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	r.res.Warnings = append(r.res.Warnings, msg)
	fmt.Fprintln(r.errOut, "tfstackplan: warning:", msg)
}

// asResultError is err as the result document says it (nil: no error); an error that is not
// a *ResultError is internal, in step.
func asResultError(step string, err error) *ResultError {
	if err == nil {
		return nil
	}
	var re *ResultError
	if !errors.As(err, &re) {
		re = newResultError(KindInternal, step, err.Error())
	}
	return re
}

// finish sets the run's outcome from err (the steps' error; nil: they all went through), once,
// then finalizes the execution on the server and writes every output. It runs on every path.
func (r *run) finish(ctx context.Context, err error) {
	drainErr := r.drain(ctx, r.pump) // the logs of a run that ended in its plan step
	r.pump = nil
	r.begin("outputs")
	headErr := r.awaitHead() // when setup failed after asking git
	// When the steps ended before it was said what Init's answer was.
	initErr := r.initError()
	for _, e := range []*ResultError{drainErr, headErr, initErr} {
		if err == nil && e != nil {
			err = e
		}
	}
	if err == nil && ctx.Err() != nil {
		err = r.cancelled(ctx, r.step, "")
	}
	res := r.res
	res.Error = asResultError(r.step, err)
	if res.Signal == nil {
		var sc runner.SignalCause
		if errors.As(context.Cause(ctx), &sc) {
			res.Signal = sc.Signal
		}
	}
	for i := range res.Stacks {
		e := &res.Stacks[i]
		if e.Class == events.ClassUnclassified || (e.Class != "" && e.Class != events.ClassNoChanges) {
			res.HasChanges = true
		}
		if len(e.Destructive) > 0 || e.Class == events.ClassDestructive {
			res.HasDestructive = true
		}
		res.Counts.Add(e.Counts)
		if e.Class != "" {
			res.Class = events.MaxClass(res.Class, e.Class)
		}
	}
	switch {
	case res.Error == nil:
		res.Status = StatusSucceeded
	case res.Error.Kind == KindCancelled:
		res.Status = StatusCancelled
	case res.Error.Kind == KindGate:
		res.Status = "denied"
	default:
		res.Status = StatusFailed
	}
	if res.Status == StatusSucceeded && len(res.Stacks) == 0 {
		res.Class = events.ClassNoChanges // nothing changed, so nothing to plan: not "no class"
	}
	r.markDrift()
	r.fillLogTails()
	r.finalize(ctx)
	r.revokeLease(ctx, res.Status)
	if !r.noFinalize {
		r.askNeeds(ctx)
	}
	r.keepShardPlans()
	r.warnUnreported()
	res.FinishedAt = r.now().UTC()
	res.DurationMS = res.FinishedAt.Sub(res.StartedAt).Milliseconds()
	r.res.Timings[r.step] += r.now().Sub(r.stepStart).Milliseconds()
	r.writeOutputs()
}
