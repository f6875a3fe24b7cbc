package job

// This file is the CI job: `run plan` and `run apply`, top to bottom.
//
//	config → discover → Init → pump → script run → drain → classify → Update
//	  (apply: → gate check → apply script run → revoke) → Finalize → outputs
//
// Every path ends in Finalize (success, failure, cancel, a recovered panic), so no execution is
// left running on the server, and in a result document. Reporting is best-effort throughout;
// only the gate check decides anything, and it fails closed.

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
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

	root    runner.StackRoot // the repository's root (root.real: absolute and symlink-free)
	tierAbs string           // absolute terramate directory
	tierRel string           // tierAbs relative to the root, "" at the root
	block   runner.Environment
	client  *runner.Client
	tm      *runner.Terramate
	script  string // the op's script
	planScr string // the plan script (apply runs it first)

	listed  []string            // stacks as terramate lists them
	paths   []string            // the same, root-relative
	byPath  map[string]string   // root-relative → listed
	entry   map[string]int      // root-relative → index in res.Stacks
	why     map[string][]string // root-relative → reasons as terramate printed them
	reasons []events.ChangeReason
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

	cancelRun  context.CancelCauseFunc
	seq        int64
	seqMu      sync.Mutex // guards seq and unreported
	unreported map[string]int
	stepStart  time.Time
	step       string
	finalized  bool
	inited     bool
	// stopBeat ends the heartbeats (nil: none were started).
	stopBeat func()
	// announced is closed once the execution's Init was answered (nil: no Init was sent). Init
	// goes out as the scripts start; refused, initErr and initPanic are read only after it.
	announced chan struct{}
	// refused is the server's refusal of the execution's Init (403: another principal
	// announced this id, or the token may not run; 400: the server will never take it):
	// nothing more is sent for it. Read it through refusal.
	refused   error
	initErr   error    // Init's outcome
	initPanic *goPanic // a panic while sending Init
	initSaid  bool     // sayInit has said what Init's answer was
	initFail  bool     // awaitInit has made initPanic the run's error
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
	// revokeAtFinish: finish revokes the execution's lease (a fan-out apply's merge).
	revokeAtFinish bool
	// shardsGate is the gate verdict a merge takes from its shards' results.
	shardsGate *GateResult
	// carried are the stacks --rerun-failed does not plan again, with what the earlier plan
	// said of them (by repository path).
	carried map[string]api.StackState
}

// Run runs `run plan` or `run apply` and returns its result document, already written to the
// result path (a failure to write it is recorded as a warning on the returned Result and
// printed). The result's Error says why the run failed; nil is success. Cancel ctx with a
// SignalCause to interrupt the run: terramate's process group gets the signal, and the run
// still drains, finalizes (cancelled), revokes the lease and writes the result.
func Run(ctx context.Context, o RunOptions) (res *Result) {
	r := newRun(o)
	ctx, r.cancelRun = context.WithCancelCause(ctx)
	defer r.cancelRun(nil)
	defer func() {
		if p := recover(); p != nil {
			r.fail(newResultError(KindInternal, r.step, fmt.Sprintf("panic: %v\n%s", p, debug.Stack())))
		}
		r.finish(ctx)
		res = r.res
	}()
	if !r.setup() {
		return
	}
	ok := r.discover(ctx)
	r.awaitHead()
	if !ok {
		return
	}
	if o.RerunFailed && !r.selectRerun(ctx) {
		return
	}
	if o.Matrix > 0 {
		r.matrix(ctx)
		return
	}
	if o.Shard != "" && !r.selectShard() {
		return
	}
	if o.DryRun {
		r.dryRun(ctx)
		return
	}
	pump := r.init(ctx)
	defer func() {
		if pump != nil {
			r.drain(ctx, pump)
		}
	}()

	// Plan (run plan; and the fresh plan run apply gates on).
	planScript := r.planScr
	if r.planning() {
		planScript = r.script
	}
	outcome, runErr := r.scriptRun(ctx, "plan", planScript, nil, pump)
	r.awaitInit(true)
	if ctx.Err() == nil || r.planning() {
		r.classify(outcome, r.planning())
	}
	if !r.scriptFailed("plan", outcome, runErr, ctx) {
		if o.Op == OpApply {
			r.drain(ctx, pump)
			pump = nil
			r.apply(ctx)
		}
	}
	return
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

// fail records the run's error (the first one wins; a later cancel does not hide a failure).
func (r *run) fail(e *ResultError) {
	if r.res.Error == nil {
		r.res.Error = e
	}
}

// setup resolves the configuration: the environment block, the flags over it, the directory,
// the server client and the GitHub context.
func (r *run) setup() bool {
	o := &r.o
	if o.Op != OpPlan && o.Op != OpApply && !r.setupDrift() {
		return false
	}
	if strings.TrimSpace(o.Environment) == "" {
		r.fail(newResultError(KindUsage, "config", "--environment is required"))
		return false
	}
	if o.Parallel < 0 {
		r.fail(newResultError(KindUsage, "config", fmt.Sprintf("--parallel must not be negative, got %d", o.Parallel)))
		return false
	}
	if o.PR < 0 {
		r.fail(newResultError(KindUsage, "config", fmt.Sprintf("--pr must be a positive pull request number, got %d", o.PR)))
		return false
	}
	if msg := cmp.Or(fanOutUsage(o), rerunUsage(o)); msg != "" {
		r.fail(newResultError(KindUsage, "config", msg))
		return false
	}
	wd := o.WorkDir
	if wd == "" {
		var err error
		if wd, err = os.Getwd(); err != nil {
			r.fail(newResultError(KindConfig, "config", err.Error()))
			return false
		}
	}
	wd, err := filepath.Abs(wd)
	if err != nil {
		r.fail(newResultError(KindConfig, "config", err.Error()))
		return false
	}
	if r.root, err = runner.NewStackRoot(runner.FindRepoRoot(wd)); err != nil {
		r.fail(newResultError(KindConfig, "config", err.Error()))
		return false
	}
	// When neither the flags nor GitHub's environment name the repository and the commit, git
	// does: a process of about 10 ms each, nearly all of setup's time when run one after the
	// other. Both start here, side by side; HEAD's answer is waited for only after discovery
	// (awaitHead), so that its call overlaps terramate's.
	var origin *call[string]
	if o.Repo == "" && strings.TrimSpace(r.gh.Repo) == "" {
		origin = goCall(func() (string, error) { return gitOrigin(r.root.Dir()), nil })
	}
	if o.SHA == "" && r.gh.SHA == "" {
		r.head = goCall(func() (string, error) { return gitHead(r.root.Dir()), nil })
	}
	cfg, err := runner.LoadRepoConfig(r.root.Dir())
	if err != nil {
		r.fail(newResultError(KindConfig, "config", err.Error()))
		return false
	}
	block := runner.Environment{Name: o.Environment}
	if cfg != nil {
		if block, err = cfg.Environment(o.Environment); err != nil {
			r.fail(newResultError(KindConfig, "config", err.Error()))
			return false
		}
	} else {
		block.ApplyDefaults()
	}
	r.block = block

	if o.Dir != "" {
		r.tierAbs = o.Dir
		if !filepath.IsAbs(r.tierAbs) {
			r.tierAbs = filepath.Join(wd, o.Dir)
		}
	} else {
		r.tierAbs = filepath.Join(r.root.Dir(), filepath.FromSlash(block.Dir))
	}
	if real, err := filepath.EvalSymlinks(r.tierAbs); err == nil {
		r.tierAbs = real
	} else {
		r.fail(newResultError(KindConfig, "config", fmt.Sprintf("terramate directory %s: %v", r.tierAbs, err)))
		return false
	}
	rel, err := filepath.Rel(r.root.Dir(), r.tierAbs)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		r.fail(newResultError(KindConfig, "config", fmt.Sprintf("terramate directory %s is outside the repository %s", r.tierAbs, r.root.Dir())))
		return false
	}
	if rel == "." {
		rel = ""
	}
	r.tierRel = filepath.ToSlash(rel)
	r.res.Dir = r.tierRel
	if r.res.Dir == "" {
		r.res.Dir = "."
	}

	def := func(v *string, fallback string) {
		if *v == "" {
			*v = fallback
		}
	}
	def(&o.LogFile, block.LogFile)
	def(&o.PlanJSON, block.PlanJSON)
	def(&o.PlanOut, DefaultPlanOutFile)
	def(&o.LockTimeout, DefaultLockTimeout)
	// tofu would refuse it in every stack, each failing on its own: refuse it once, here.
	if d, err := time.ParseDuration(o.LockTimeout); err != nil || d < 0 {
		r.fail(newResultError(KindUsage, "config", fmt.Sprintf("--lock-timeout %q is not a duration such as 0s, 30s or 5m", o.LockTimeout)))
		return false
	}
	for name, v := range map[string]string{"--log-file": o.LogFile, "--plan-file": o.PlanJSON, "--plan-out": o.PlanOut} {
		if strings.ContainsAny(v, `/\`) || v == "." || v == ".." || strings.ContainsRune(v, 0) {
			r.fail(newResultError(KindUsage, "config", fmt.Sprintf("%s %q must be a plain file name inside each stack directory", name, v)))
			return false
		}
	}
	r.planScr = block.PlanScript
	r.script = block.PlanScript
	if o.Op == OpApply {
		r.script = block.ApplyScript
	}
	if o.Script != "" {
		r.script = o.Script
	}

	repo, rerr := r.repo(origin)
	if rerr != nil {
		r.fail(rerr)
		return false
	}
	o.Repo = repo
	def(&o.SHA, r.gh.SHA)
	def(&o.Actor, r.gh.Actor)
	def(&o.RunURL, r.gh.RunURL)
	if o.PR == 0 && o.Op != OpDrift {
		o.PR = r.gh.PR
	}
	r.execGiven = o.ExecutionID != ""
	if o.ExecutionID == "" {
		o.ExecutionID = newExecutionID()
	}
	if o.CommentFile == "" && r.gh.Actions && r.gh.RunnerTemp != "" && o.Op != OpDrift {
		o.CommentFile = filepath.Join(r.gh.RunnerTemp, "tfstackplan-comment-"+safeFileWord(o.Environment)+".md")
	}
	r.res.Execution, r.res.PR, r.res.SHA, r.res.Repo = o.ExecutionID, o.PR, o.SHA, o.Repo

	r.client = o.Client
	if r.client == nil {
		c, err := runner.RunClient(block, r.getenv)
		switch {
		case err == nil:
			r.client = c
		case !r.unusable(err, fmt.Sprintf("the tfstackplan server cannot be used, reporting is off: %v", err)):
			return false
		}
	}
	if r.client.Enabled() && o.Repo == "" && !r.unusable(ErrNoRepo, ErrNoRepo.Error()+"; reporting disabled") {
		return false
	}
	if r.client.Enabled() {
		r.res.Server = r.client.BaseURL()
		r.res.ExecutionURL = executionURL(r.res.Server, o.ExecutionID)
	}
	if o.Op == OpApply && o.PR <= 0 && r.client.Enabled() {
		r.fail(newResultError(KindUsage, "config", "run apply needs the pull request whose plan was approved: pass --pr (or run on a pull_request event)"))
		return false
	}

	r.tm = o.Terramate
	if r.tm == nil {
		r.tm = &runner.Terramate{}
	}
	tm := *r.tm
	tm.Dir = r.tierAbs
	r.tm = &tm
	return true
}

// unusable deals with a configured server the run cannot use, for the reason err: an apply is
// denied (the gate cannot be asked, and an apply never runs unchecked) and unusable returns
// false; a plan goes on with a client that reports nothing, after warning.
func (r *run) unusable(err error, warning string) bool {
	if r.o.Op == OpApply {
		r.fail(newResultError(KindGate, "config", "the gate cannot be checked: "+err.Error()))
		r.res.Gate = &GateResult{Verdict: runner.VerdictNotSatisfied.String(), Message: err.Error()}
		return false
	}
	r.warn("%s", warning)
	r.client = runner.BrokenClient(err)
	return true
}

// awaitHead records the commit git named for HEAD, once setup's call (if any) has answered.
func (r *run) awaitHead() {
	if r.head == nil {
		return
	}
	sha, _ := r.head.wait()
	r.head = nil
	r.o.SHA, r.res.SHA = sha, sha
}

// gitHead returns the commit checked out in dir, "" when git cannot tell (bounded).
func gitHead(dir string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", "rev-parse", "--verify", "-q", "HEAD")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// newExecutionID returns a random execution id.
func newExecutionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// safeFileWord keeps letters, digits, '-', '_' and '.' of s, for a file name.
func safeFileWord(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' {
			return r
		}
		return '_'
	}, s)
}

// discover lists the stacks (changed or all), why they changed, and the edges between them.
func (r *run) discover(ctx context.Context) bool {
	r.begin("discover")
	// The list, why its stacks changed and the run graph are three terramate calls that read
	// the same files (about 100 ms each with real terramate on a small project): they run at
	// once, and the last two are stopped when the list fails or is empty.
	cctx, stopCalls := context.WithCancel(ctx)
	defer stopCalls()
	graph := goCall(func() (runner.RunGraphResult, error) { return r.tm.RunGraphDetailed(cctx) })
	var why *call[[]string]
	if !r.o.All {
		why = goCall(func() ([]string, error) { return r.tm.WhyLines(cctx, r.o.Base) })
	}
	abandon := func() {
		stopCalls()
		_, _ = graph.wait()
		if why != nil {
			_, _ = why.wait()
		}
	}
	var listed []string
	var err error
	if r.o.All {
		listed, err = r.tm.List(ctx)
	} else {
		listed, err = r.tm.ChangedStacks(ctx, r.o.Base)
	}
	if err != nil {
		abandon()
		r.failTerramate("discover", err, ctx)
		return false
	}
	r.byPath = map[string]string{}
	for _, s := range listed {
		p := s
		if r.tierRel != "" {
			p = path.Join(r.tierRel, s)
		}
		p = path.Clean(p)
		if _, err := r.root.StackPath(p); err != nil {
			abandon()
			r.fail(newResultError(KindTerramate, "discover", fmt.Sprintf("terramate listed stack %q, which is not a directory inside the repository: %v", s, err)))
			return false
		}
		if _, dup := r.byPath[p]; dup {
			continue
		}
		r.byPath[p] = s
		r.listed = append(r.listed, s)
		r.paths = append(r.paths, p)
	}
	r.why = map[string][]string{}
	if len(r.listed) == 0 {
		abandon()
		return true
	}
	if why != nil {
		lines, err := why.wait()
		if err != nil {
			abandon()
			r.failTerramate("discover", err, ctx)
			return false
		}
		for _, cr := range runner.ParseWhyLines(lines, listed) {
			if p := r.rootPath(cr.Stack); p != "" {
				cr.Stack = p
				r.why[p] = append(r.why[p], cr.Raw)
				r.reasons = append(r.reasons, cr)
			}
		}
	}
	g, err := graph.wait()
	if err != nil {
		r.failTerramate("discover", err, ctx)
		return false
	}
	r.res.Edges = runner.NormalizeEdgesIn(r.tierRel, r.listed, g.Edges)
	r.res.EdgesApproximate = g.Approximate
	r.entry = make(map[string]int, len(r.paths))
	for _, p := range r.paths {
		r.entry[p] = len(r.res.Stacks)
		r.res.Stacks = append(r.res.Stacks, StackEntry{
			Stack: r.byPath[p], Path: p, Status: StatusNotRun, Destructive: []string{}, Why: r.why[p],
		})
	}
	return true
}

// call is a function running on its own goroutine (goCall).
type call[T any] struct {
	done  chan struct{}
	value T
	err   error
	panic *goPanic
}

// goCall starts f on its own goroutine.
func goCall[T any](f func() (T, error)) *call[T] {
	c := &call[T]{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer catchPanic(&c.panic)
		c.value, c.err = f()
	}()
	return c
}

// wait returns what the call returned once it has, and raises its panic again on the
// caller's goroutine (where Run recovers it).
func (c *call[T]) wait() (T, error) {
	<-c.done
	if c.panic != nil {
		panic(*c.panic)
	}
	return c.value, c.err
}

// rootPath maps a stack as listed to its root-relative path ("" when not selected).
func (r *run) rootPath(listed string) string {
	p := listed
	if r.tierRel != "" {
		p = path.Join(r.tierRel, listed)
	}
	p = path.Clean(p)
	if _, ok := r.byPath[p]; ok {
		return p
	}
	return ""
}

// failTerramate records a terramate failure (or the cancellation that caused it).
func (r *run) failTerramate(step string, err error, ctx context.Context) {
	if ctx.Err() != nil {
		r.failCancelled(ctx)
		return
	}
	r.fail(newResultError(KindTerramate, step, err.Error()))
}

// interruptedLocks marks every stack the interrupt caught in the middle of its script with the
// state lock it may still hold (killed: terramate's processes were killed after the interrupt
// grace), and says so in a sentence per stack ("" when none holds one).
func (r *run) interruptedLocks(out scriptOutcome, killed bool) string {
	var b strings.Builder
	for i := range r.res.Stacks {
		e := &r.res.Stacks[i]
		if cmp.Or(e.Status, out.status(e.Path, false)) != StatusCancelled {
			continue
		}
		if e.Lock = r.stateLock(e.Path, killed); e.Lock == nil {
			continue
		}
		if e.Lock.ID != "" {
			fmt.Fprintf(&b, "\nstack %s may hold state lock %s; release it with: %s", e.Path, e.Lock.ID, e.Lock.Command)
		} else {
			fmt.Fprintf(&b, "\nstack %s was interrupted and may hold its state lock; its next plan names the lock ID, then re-run with --force-unlock ID", e.Path)
		}
	}
	return b.String()
}

func (r *run) failCancelled(ctx context.Context) { r.failCancelledIn(ctx, r.step, "") }

// failCancelledIn records that the run was cancelled during step; detail is added to the
// message.
func (r *run) failCancelledIn(ctx context.Context, step, detail string) {
	cause := context.Cause(ctx)
	var sc runner.SignalCause
	if errors.As(cause, &sc) {
		r.res.Signal = sc.Signal
	}
	msg := "the run was cancelled"
	if cause != nil && !errors.Is(cause, context.Canceled) {
		msg += ": " + cause.Error()
	}
	r.fail(newResultError(KindCancelled, step, msg+detail))
}

func (r *run) dryRun(ctx context.Context) {
	r.begin("dry-run")
	w := newScriptWatcher(r.out)
	err := r.tm.ScriptRun(ctx, w, runner.ScriptRunOptions{
		Script: r.script, Changed: !r.o.All, Base: r.o.Base, Parallel: r.o.Parallel,
		ContinueOnError: r.o.ContinueOnError, DryRun: true, Env: r.scriptEnv("", nil),
	})
	if err != nil {
		r.failTerramate("dry-run", err, ctx)
	}
}

// seqNext orders the runner's own events for one execution.
func (r *run) seqNext() int64 {
	r.seqMu.Lock()
	defer r.seqMu.Unlock()
	r.seq = max(r.seq+1, r.now().UnixNano())
	return r.seq
}

// event handles a best-effort call's error: a cancel from the server stops the run, anything
// else is a warning.
func (r *run) event(op string, err error) {
	if err == nil {
		return
	}
	if errors.Is(err, runner.ErrCancelRequested) {
		r.cancelRun(err)
		return
	}
	r.seqMu.Lock()
	if r.unreported == nil {
		r.unreported = map[string]int{}
	}
	r.unreported[op]++
	first := r.unreported[op] == 1
	r.seqMu.Unlock()
	if first {
		// One warning per kind of event: a dead server must not print one line per stack.
		r.warn("%s not reported: %v", op, err)
	}
}

// warnUnreported sums up the failed reports of each kind after the first (a report is one
// request, which for a batch operation carries several events).
func (r *run) warnUnreported() {
	r.seqMu.Lock()
	ops := make([]string, 0, len(r.unreported))
	for op, n := range r.unreported {
		if n > 1 {
			ops = append(ops, op)
		}
	}
	counts := maps.Clone(r.unreported)
	r.seqMu.Unlock()
	slices.Sort(ops)
	for _, op := range ops {
		r.warn("%d more %s reports failed", counts[op]-1, op)
	}
}

// The contract's bounds on one Init (api/openapi.yaml: maxItems, and the server's 12 MiB body
// limit): a run past them announces what fits, says so in a warning, and marks the edges
// approximate. Its stacks are never cut: a run of more than 10,000 stacks is refused by the
// server, and runs unreported.
const (
	maxInitEdges   = 50_000
	maxInitReasons = 10_000
	maxInitBytes   = 12<<20 - 64<<10 // the server's body limit for an Init, with room to spare
)

// fitInit makes in fit limit bytes of JSON when long paths make it larger: it halves the
// edges (marking them approximate), then the reasons, until it fits or none are left. It
// returns in's JSON as it ends up, and whether it cut anything. The stacks are never cut.
func fitInit(in *events.Init, limit int) ([]byte, bool, error) {
	b, err := json.Marshal(in)
	cut := false
	for err == nil && len(b) > limit && (len(in.Edges) > 0 || len(in.Reasons) > 0) {
		if len(in.Edges) > 0 {
			in.Edges, in.EdgesApproximate = in.Edges[:len(in.Edges)/2], true
		} else {
			in.Reasons = in.Reasons[:len(in.Reasons)/2]
		}
		cut = true
		b, err = json.Marshal(in)
	}
	return b, cut, err
}

// init announces the execution and starts the log pump (nil without a server or stacks). Init
// is not waited for: the scripts start while it is in flight (a slow server costs the build
// no time here), and everything sent for the execution waits for its answer (see refusal and
// cancellingPoster). awaitInit, on the flow's goroutine, says what the answer was.
func (r *run) init(ctx context.Context) *runner.LogPump {
	r.begin("init")
	if !r.client.Enabled() {
		return nil
	}
	named := r.separateUnnamed()
	edges := make([]events.Edge, 0, min(len(r.res.Edges), maxInitEdges))
	approximate := r.res.EdgesApproximate
	for _, e := range r.res.Edges[:min(len(r.res.Edges), maxInitEdges)] {
		if from, to := r.rootPath(e.From), r.rootPath(e.To); r.named(from) && r.named(to) {
			edges = append(edges, events.Edge{From: from, To: to})
		} else {
			approximate = true // an edge left out: a → odd → b says nothing of a and b
		}
	}
	if len(r.res.Edges) > maxInitEdges {
		approximate = true
		r.warn("Init: the run graph's %d edges are more than the server takes; the first %d are sent", len(r.res.Edges), maxInitEdges)
	}
	reasons := r.reasons
	if len(r.unnamed) > 0 {
		reasons = slices.DeleteFunc(slices.Clone(reasons), func(cr events.ChangeReason) bool { return !r.named(cr.Stack) })
	}
	if len(reasons) > maxInitReasons {
		r.warn("Init: the %d change reasons are more than the server takes; the first %d are sent", len(reasons), maxInitReasons)
		reasons = reasons[:maxInitReasons]
	}
	reasons, fitted := fitReasons(reasons)
	if fitted > 0 {
		r.warn("Init: %d change reasons had texts the server does not take (over %d bytes, not UTF-8, a NUL byte) or more than %d steps; they are sent clipped", fitted, events.MaxReasonText, events.MaxReasonChain)
	}
	in := events.Init{
		ExecutionID: r.o.ExecutionID, Op: api.InitOp(r.o.Op), Environment: r.o.Environment,
		Repo: r.o.Repo, PR: r.o.PR, SHA: r.o.SHA, Base: r.o.Base, Actor: r.o.Actor, RunURL: r.o.RunURL,
		Stacks: named, Edges: edges, EdgesApproximate: approximate,
		Reasons: reasons, StartedAt: r.res.StartedAt,
	}
	body, cut, encErr := fitInit(&in, maxInitBytes)
	if cut {
		r.warn("Init: the announcement was too large for one request; %d of the run graph's edges and %d of the change reasons are sent", len(in.Edges), len(in.Reasons))
	}
	// Finalize follows even when Init seemed to fail: a slow server may have stored it anyway,
	// and no execution may stay running there. It also waits for Init's answer (refusal).
	r.inited = true
	announced := make(chan struct{})
	r.announced = announced
	r.stopBeat = r.heartbeat(ctx, announced)
	go func() {
		defer close(announced)
		defer func() {
			if r.initPanic != nil {
				r.cancelRun(errInitPanicked) // the run is broken: stop the scripts now
			}
		}()
		defer catchPanic(&r.initPanic)
		r.initErr = encErr
		if encErr == nil {
			r.initErr = r.client.InitJSON(ctx, body)
		}
		switch {
		case refusedForGood(r.initErr):
			r.refused = r.initErr
		case errors.Is(r.initErr, runner.ErrCancelRequested):
			r.cancelRun(r.initErr) // an administrator cancelled it already: stop the scripts
		}
	}()
	return r.startPump(ctx, announced)
}

// separateUnnamed finds the stacks whose paths the server does not take as names (r.unnamed),
// says which they are, and returns the others' paths.
func (r *run) separateUnnamed() (named []string) {
	r.unnamed = map[string]string{}
	var odd []string
	for _, p := range r.paths {
		if problem := events.NameProblem(p); problem != "" {
			r.unnamed[p] = problem
			if len(odd) < maxListedUnnamed {
				odd = append(odd, fmt.Sprintf("%q %s", truncate(p, 80), problem))
			}
			continue
		}
		named = append(named, p)
	}
	if len(r.unnamed) > 0 {
		more := ""
		if n := len(r.unnamed) - len(odd); n > 0 {
			more = fmt.Sprintf(" and %d more", n)
		}
		r.warn("%d stacks are left out of what is reported, their paths being names the server does not take: %s%s", len(r.unnamed), strings.Join(odd, ", "), more)
	}
	return named
}

// maxListedUnnamed is how many of the stacks left out of the reports their warning names.
const maxListedUnnamed = 10

// named reports whether the server takes path as a stack's name: whether the stack is
// reported.
func (r *run) named(path string) bool {
	_, odd := r.unnamed[path]
	return !odd
}

// errInitPanicked stops the run, and what is sent for it, when sending Init panicked.
var errInitPanicked = errors.New("sending the execution's Init panicked")

// refusal waits for Init's answer and returns the server's refusal of the execution (nil: not
// refused, or no Init was sent). Init's call is bounded by the client's call budget.
func (r *run) refusal() error {
	if r.announced == nil {
		return nil
	}
	<-r.announced
	return r.refused
}

// silenced waits for Init's answer and returns why no phase, update or log is sent for the
// execution: the server refused it, or sending Init panicked (Finalize is still sent then,
// lest the execution stay running should Init have arrived). nil: they are sent.
func (r *run) silenced() error {
	if err := r.refusal(); err != nil {
		return err
	}
	if r.initPanic != nil {
		return errInitPanicked
	}
	return nil
}

// sayInit waits for Init's answer and says once what it was: a refusal or a failure is a
// warning (a panic is awaitInit's). The tick relay's first post calls it, so that the warning
// comes early in the log, and awaitInit after the script run: never two goroutines at once.
func (r *run) sayInit() {
	if r.refusal(); r.announced == nil || r.initSaid || r.initPanic != nil {
		return
	}
	r.initSaid = true
	if r.refused != nil {
		r.warn("the server refused this execution (%v): its phases, updates, logs and Finalize are not sent", r.refused)
	} else {
		r.event("Init", r.initErr)
	}
}

// awaitInit waits for Init's answer and says what it was (sayInit). A panic while sending Init
// is the run's error (internal, step init), and with raise it is raised again here, on the
// flow's goroutine, to end the flow.
func (r *run) awaitInit(raise bool) {
	r.sayInit()
	if p := r.initPanic; p != nil && !r.initFail {
		r.initFail = true
		r.fail(newResultError(KindInternal, "init", "panic: "+p.String()))
		if raise {
			panic(*p)
		}
	}
}

// refusedForGood reports whether err is a refusal that no retry changes: the server's 403,
// or its 400 (a request it will never take as it stands; every later event would then be
// answered "no such execution").
func refusedForGood(err error) bool {
	var ae *runner.APIError
	return errors.As(err, &ae) && (ae.StatusCode == http.StatusForbidden || ae.StatusCode == http.StatusBadRequest)
}

// reporting reports whether the run's events go to the server: one is configured, and the
// execution's Init went out and was not refused (it waits for Init's answer; see silenced).
func (r *run) reporting() bool {
	return r.client.Enabled() && r.silenced() == nil
}

// goPanic is a panic recovered in one of the flow's goroutines, raised again on the flow's
// own goroutine (where Run recovers it) with the stack it happened on.
type goPanic struct {
	value any
	stack []byte
}

func (g goPanic) String() string {
	return fmt.Sprintf("%v\n\n[raised in another goroutine]\n%s", g.value, g.stack)
}

// catchPanic, deferred by a goroutine of the flow, recovers its panic into *p.
func catchPanic(p **goPanic) {
	if v := recover(); v != nil {
		*p = &goPanic{value: v, stack: debug.Stack()}
	}
}

// cancellingPoster is the pump's poster: a server-side cancel seen on a log post stops the run.
// It posts nothing before announced is closed (the execution's Init was answered).
type cancellingPoster struct {
	c         *runner.Client
	cancel    context.CancelCauseFunc
	announced <-chan struct{}
	silenced  func() error // why nothing is sent for the execution (run.silenced), read once announced is closed
}

func (p cancellingPoster) Enabled() bool { return p.c.Enabled() }

// post runs send once the execution was announced (or returns ctx's error first), and stops
// the run when the server answers that it was cancelled. When the server refused the
// execution's Init (or sending it panicked), nothing is sent: the post fails with that error,
// which ends the pump.
func (p cancellingPoster) post(ctx context.Context, send func() error) error {
	select {
	case <-p.announced:
	case <-ctx.Done():
		return ctx.Err()
	}
	if p.silenced != nil {
		if err := p.silenced(); err != nil {
			return fmt.Errorf("%w: %w", runner.ErrSilenced, err)
		}
	}
	err := send()
	if errors.Is(err, runner.ErrCancelRequested) {
		p.cancel(err)
	}
	return err
}

func (p cancellingPoster) LogChunk(ctx context.Context, lc events.LogChunk) error {
	return p.post(ctx, func() error { return p.c.LogChunk(ctx, lc) })
}

func (p cancellingPoster) LogChunks(ctx context.Context, chunks []events.LogChunk) error {
	return p.post(ctx, func() error { return p.c.LogChunks(ctx, chunks) })
}

// announcedLongAgo is a closed channel, for a pump started after Init was answered.
var announcedLongAgo = func() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// startPump starts the log pump over the run's stacks; it posts once announced is closed.
func (r *run) startPump(ctx context.Context, announced <-chan struct{}) *runner.LogPump {
	if !r.client.Enabled() || len(r.paths) == 0 {
		return nil
	}
	p := runner.NewLogPump(cancellingPoster{c: r.client, cancel: r.cancelRun, announced: announced, silenced: r.silenced}, r.root.Dir(), r.o.LogFile, r.o.ExecutionID)
	opts := r.o.Pump
	// Each script run starts the stacks' logs afresh, numbered after the generations an
	// earlier script run of this execution posted (run apply's plan script).
	opts.Fresh, opts.FirstGenerations = true, r.nextGens
	if err := p.SetOptions(opts); err != nil {
		r.warn("log pump: %v", err)
		return nil
	}
	for _, s := range r.paths {
		if !r.named(s) {
			continue
		}
		if err := p.AddStack(s); err != nil {
			r.warn("log pump: %v", err)
		}
	}
	if err := p.Start(context.WithoutCancel(ctx)); err != nil {
		r.warn("log pump: %v", err)
		return nil
	}
	return p
}

// startDrain starts draining p (bounded): the scripts have stopped writing, so the pump's last
// looks and posts go on while the flow does what follows (the tick relay's last round, the
// classification of the last stacks) instead of after it. drain waits for it.
func (r *run) startDrain(ctx context.Context, p *runner.LogPump) {
	if p == nil || r.draining != nil && r.draining.pump == p {
		return
	}
	budget := r.drainBudget(ctx)
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budget)
	r.draining = &pendingDrain{pump: p, budget: budget, cancel: cancel, call: goCall(func() (runner.DrainReport, error) {
		defer cancel()
		return p.Drain(dctx), nil
	})}
}

// drainBudget bounds a drain that starts now.
func (r *run) drainBudget(ctx context.Context) time.Duration {
	switch {
	case r.client.Unreachable():
		// The server failed recently: waiting for it would only cost the build time.
		return UnreachableDrainBudget
	case ctx.Err() != nil:
		return CancelDrainBudget
	}
	return DrainBudget
}

// pendingDrain is a pump's drain under way (startDrain).
type pendingDrain struct {
	pump   *runner.LogPump
	call   *call[runner.DrainReport]
	budget time.Duration      // what it was given
	cancel context.CancelFunc // ends it
}

// drain waits for the pump's drain (starting it when startDrain did not) and says what did not
// reach the server.
func (r *run) drain(ctx context.Context, p *runner.LogPump) {
	if p == nil {
		return
	}
	step := r.step
	r.begin("drain")
	defer r.begin(step)
	r.startDrain(ctx, p)
	d := r.draining
	r.draining = nil
	if b := r.drainBudget(ctx); b < d.budget {
		// The server failed, or the run was cancelled, since the drain started (the relay's
		// last round, the last updates found the server dead): wait no longer than a drain
		// started now would.
		stop := time.AfterFunc(b, d.cancel)
		defer stop.Stop()
	}
	rep, _ := d.call.wait()
	r.nextGens = p.NextGenerations()
	switch {
	case rep.Stopped != nil && errors.Is(rep.Stopped, r.silenced()):
		// Said when Init was refused (or panicked).
	case rep.Stopped != nil && !errors.Is(rep.Stopped, runner.ErrCancelRequested):
		r.warn("logs: the server refused them (%d bytes not sent): %v", rep.LostBytes(), rep.Stopped)
	case !rep.Complete && rep.Stopped == nil:
		r.warn("logs: %d bytes did not reach the server", rep.LostBytes())
	}
	for _, e := range rep.Errors {
		r.warn("logs: %s", e)
	}
}

// scriptEnv is the environment terramate and the scripts get.
func (r *run) scriptEnv(tickDir string, extra []string) []string {
	env := []string{
		EnvOp + "=" + r.o.Op,
		runner.EnvEnvironment + "=" + r.o.Environment,
		runner.EnvExecution + "=" + r.o.ExecutionID,
		EnvLogFile + "=" + r.o.LogFile,
		EnvPlanOut + "=" + r.o.PlanOut,
		EnvPlanJSON + "=" + r.o.PlanJSON,
		EnvLockTimeout + "=" + r.o.LockTimeout,
		EnvForceUnlock + "=" + r.o.ForceUnlock,
		runner.EnvTickDir + "=" + tickDir,
		runner.EnvServer + "=" + r.client.BaseURL(),
	}
	if r.client.Enabled() {
		// The scripts' ticks authenticate the way the driver does (a static token is
		// inherited as it is).
		if a := r.client.Audience(); a != "" {
			env = append(env, runner.EnvAudience+"="+a, runner.EnvAuth+"="+r.client.AuthMode())
		} else {
			env = append(env, runner.EnvAuth+"=")
		}
	} else {
		env = append(env, runner.EnvAudience+"=", runner.EnvToken+"=", runner.EnvAuth+"=")
	}
	if dir := ensureSelfOnPath(r.getenv); dir != "" {
		env = append(env, "PATH="+dir+string(os.PathListSeparator)+r.getenv("PATH"))
	}
	return append(env, extra...)
}

// ensureSelfOnPath makes `tfstackplan` resolvable for the scripts' ticks: when it is not on
// PATH, it returns a directory holding a link named tfstackplan to this executable.
var selfDir struct {
	once sync.Once
	dir  string
}

func ensureSelfOnPath(getenv func(string) string) string {
	if p, err := exec.LookPath("tfstackplan"); err == nil && p != "" {
		return ""
	}
	selfDir.once.Do(func() {
		exe, err := os.Executable()
		if err != nil {
			return
		}
		dir, err := os.MkdirTemp("", "tfstackplan-bin-")
		if err != nil {
			return
		}
		if os.Symlink(exe, filepath.Join(dir, "tfstackplan")) == nil {
			selfDir.dir = dir
		}
	})
	return selfDir.dir
}

// scriptRun runs one terramate script over the selected stacks and says what happened to each;
// pump (nil: none) tails their logs, and its drain starts as soon as terramate returns.
func (r *run) scriptRun(ctx context.Context, step, script string, extraEnv []string, pump *runner.LogPump) (scriptOutcome, error) {
	r.begin(step)
	tickDir, err := os.MkdirTemp("", "tfstackplan-ticks-")
	if err != nil {
		r.warn("ticks: %v", err)
		tickDir = ""
		// The scripts' ticks then go to the server themselves: they must not get there before
		// the execution's Init, so the scripts wait for its answer here.
		_ = r.refusal()
	} else {
		defer os.RemoveAll(tickDir)
	}
	actions := r.gh.Actions
	rawTitle := fmt.Sprintf("terramate script run %s (%s, %d stacks)", script, r.o.Environment, len(r.paths))
	raw, jl := r.startJobLog(step)
	if raw != nil {
		if actions {
			defer os.Remove(raw.Name()) // it is printed, at the end
		}
		defer raw.Close()
	}
	resume := ""
	if actions && jl == nil {
		fmt.Fprintf(r.out, "::group::%s\n", rawTitle)
		// The scripts' output is not ours to trust: a line in it must not become a workflow
		// command (::add-mask::, ::error::, ::endgroup:: ...) until the run is over.
		resume = randomDelimiter()
		fmt.Fprintf(r.out, "::stop-commands::%s\n", resume)
	}
	var ticks *runner.TickReader
	stopRelay := func() {}
	if tickDir != "" {
		ticks = runner.NewTickReader(tickDir, func(stack string) bool { _, ok := r.byPath[stack]; return ok })
		stopRelay = r.relayTicks(ctx, ticks, step == "plan" && r.planning(), jl)
		defer stopRelay() // on a panic too
	}
	var w *scriptWatcher
	if jl != nil {
		w = newScriptWatcher(raw)
		w.onStart = jl.start
		w.onFail = func(stack string) { jl.end(stack, StatusFailed, "") }
	} else {
		w = newScriptWatcher(r.out)
	}
	stopWatch := context.AfterFunc(ctx, w.interrupt)
	defer stopWatch()
	sro := runner.ScriptRunOptions{
		Script: script, Changed: !r.o.All, Base: r.o.Base, Parallel: r.o.Parallel,
		ContinueOnError: r.o.ContinueOnError, Env: r.scriptEnv(tickDir, extraEnv),
		StackFiles: []string{r.o.LogFile, r.o.PlanOut, r.o.PlanJSON},
	}
	var runErr error
	if r.subset {
		runErr = r.tm.ScriptRunStacks(ctx, w, sro, r.toRun(), r.after())
	} else {
		runErr = r.tm.ScriptRun(ctx, w, sro)
	}
	r.startDrain(ctx, pump)
	stopRelay()
	if resume != "" {
		fmt.Fprintf(r.out, "\n::%s::\n::endgroup::\n", resume)
	}
	started, failed := w.snapshot()
	var te *runner.TerramateError
	if errors.As(runErr, &te) {
		for _, s := range te.FailedStacks {
			failed[strings.TrimPrefix(s, "/")] = true
		}
	}
	out := scriptOutcome{started: started, failed: failed, exitOK: runErr == nil, cancelled: ctx.Err() != nil}
	if out.cancelled {
		out.failedBefore = w.failedBefore()
	}
	if ticks != nil {
		out.ticks = ticks.Stacks()
	}
	if jl != nil {
		jl.finish(func(stack string) (string, events.Class) {
			var class events.Class
			if s := r.early[stack]; s != nil {
				class = s.Class
			}
			return out.status(stack, false), class
		})
		if actions {
			fmt.Fprintf(r.out, "::group::%s: terramate's own output\n", rawTitle)
			b, skipped := maskedTail(jl.masker, raw.Name(), maxRawGroup)
			if skipped > 0 {
				fmt.Fprintf(r.out, "(the first %d bytes are left out)\n", skipped)
			}
			writeUncommanded(r.out, b)
			fmt.Fprintln(r.out, "::endgroup::")
		}
	}
	return out, runErr
}

// TickRelayInterval is how often the driver looks for new ticks to relay to the server (with
// the updates of the stacks that finished meanwhile), by default. Half a second keeps the web
// page live to a reader's eye (a log line takes about as long, see Liveness in pump.go), and
// each look that finds something costs two requests (Phases, Updates): on the 200-stack
// benchmark, 250 ms made about 50 of them per run, and the driver's and the server's CPU were
// about a tenth higher than with 500 ms.
const TickRelayInterval = 500 * time.Millisecond

// relayTicks posts the scripts' ticks to the server as Phase events while a script run goes on
// (best-effort, through the driver's client and its breaker), and during `run plan` (live)
// classifies each stack as soon as it ticks done, so that its update goes out with the next
// post and the classification does not wait for the whole run. The returned stop reads what is
// left, posts it, and waits. Without a server a plan still classifies early (the run's end then
// has that much less to do); an apply only reads the ticks, at stop, for the stacks' statuses,
// unless jl (the job's own log, nil when off) is to hear of each stack that ticks done.
func (r *run) relayTicks(ctx context.Context, t *runner.TickReader, live bool, jl *jobLog) (stop func()) {
	if !r.client.Enabled() && !live && jl == nil {
		var once sync.Once
		return func() { once.Do(func() { t.Next() }) }
	}
	post := func(recs []runner.TickRecord) {
		// Waits for Init's answer (sent as the scripts started); the ticks wait in their file.
		reporting := r.reporting()
		r.sayInit()
		var batch []events.PhaseEvent
		var done, ended []string
		endStatus := map[string]string{}
		for _, rec := range recs {
			if _, ok := r.byPath[rec.Stack]; !ok {
				continue // not a stack of this run: never reported
			}
			if reporting && r.named(rec.Stack) {
				batch = append(batch, events.PhaseEvent{
					ExecutionID: r.o.ExecutionID, Stack: rec.Stack, Phase: rec.Phase, Status: rec.Status,
					Message: rec.Message, At: time.Unix(0, rec.At).UTC(), Seq: r.seqNext(),
				})
			}
			if live && rec.Phase == "done" && strings.EqualFold(rec.Status, StatusSucceeded) {
				done = append(done, rec.Stack)
			}
			if jl != nil && rec.Phase == "done" {
				ended = append(ended, rec.Stack)
				endStatus[rec.Stack] = StatusSucceeded
				if (runner.TickStatus{}).Add(rec).Failed {
					endStatus[rec.Stack] = StatusFailed
				}
			}
		}
		pctx := context.WithoutCancel(ctx)
		// The phases travel while the stacks that are done get classified; the updates follow
		// them, as before.
		var phases *call[struct{}]
		if reporting {
			phases = goCall(func() (struct{}, error) { return struct{}{}, r.client.Phases(pctx, batch) })
		}
		var updates []events.Update
		for _, stack := range done {
			if u, ok := r.classifyEarly(stack); ok && r.named(stack) {
				updates = append(updates, u)
			}
		}
		for _, stack := range ended {
			var class events.Class
			if s := r.early[stack]; s != nil {
				class = s.Class
			}
			jl.end(stack, endStatus[stack], class)
		}
		if reporting {
			_, err := phases.wait()
			r.event("Phase", err)
			r.event("Update", r.client.Updates(pctx, updates))
		}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	// A panic here (classifying a plan, say) is raised again by stop, on the flow's goroutine,
	// where Run recovers it.
	var relayPanic *goPanic
	go func() {
		defer close(finished)
		defer catchPanic(&relayPanic)
		every := r.o.TickRelay
		if every <= 0 {
			every = TickRelayInterval
		}
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-done:
				post(t.Next())
				return
			case <-tick.C:
				post(t.Next())
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			<-finished
			if relayPanic != nil {
				panic(*relayPanic)
			}
		})
	}
}

// scriptFailed records what a script run's failure means for the run; true when the run must
// stop here.
func (r *run) scriptFailed(step string, out scriptOutcome, runErr error, ctx context.Context) bool {
	if ctx.Err() != nil {
		// Named after the step interrupted, not the classification that followed it.
		r.failCancelledIn(ctx, step, r.interruptedLocks(out, errors.Is(runErr, runner.ErrKilledAfterGrace)))
		return true
	}
	var failedStacks []string
	for i, e := range r.res.Stacks {
		if e.Status == StatusFailed {
			failedStacks = append(failedStacks, r.res.Stacks[i].Stack)
		}
	}
	if runErr != nil {
		kind := KindTerramate
		if len(failedStacks) > 0 || errors.Is(runErr, runner.ErrScriptFailed) {
			kind = KindScript
		}
		msg := runErr.Error()
		if len(failedStacks) > 0 {
			msg = "failed stacks: " + strings.Join(failedStacks, ", ") + "\n" + msg
		}
		r.fail(newResultError(kind, step, msg))
		return true
	}
	if len(failedStacks) > 0 {
		r.fail(newResultError(KindScript, step, "failed stacks: "+strings.Join(failedStacks, ", ")))
		return true
	}
	var unclassified []string
	for _, e := range r.res.Stacks {
		if e.Class == events.ClassUnclassified {
			unclassified = append(unclassified, e.Stack+": "+e.Error)
		}
	}
	if len(unclassified) > 0 {
		r.fail(newResultError(KindClassify, step, "plans that could not be read:\n"+strings.Join(unclassified, "\n")))
		return true
	}
	return false
}

// classify sets each stack's status from the script run and classifies the plans of the
// stacks that succeeded; report sends each stack's Update.
func (r *run) classify(out scriptOutcome, report bool) {
	r.begin("classify")
	r.classed = map[string]*plan.Stack{}
	r.report = &plan.Report{ExecutionURL: r.res.ExecutionURL}
	var unsent []int
	for i := range r.res.Stacks {
		e := &r.res.Stacks[i]
		if c, ok := r.carried[e.Path]; ok {
			s := r.carry(e.Path, c)
			s.Why = e.Why
			r.classed[e.Path] = s
			r.report.Stacks = append(r.report.Stacks, s)
			e.Status, e.Class, e.Counts, e.PlanHash = StatusSucceeded, s.Class, s.Counts, s.PlanHash
			e.Destructive = append([]string{}, c.Destructive...)
			unsent = append(unsent, i)
			continue
		}
		s := r.early[e.Path]
		// A stack classified early ticked done with its fresh plan: no need to look again.
		file, fresh, ferr := "", true, error(nil)
		if s == nil {
			file, fresh, ferr = r.planFile(e.Path)
		}
		e.Status = out.status(e.Path, fresh)
		if s == nil || e.Status != StatusSucceeded {
			s = r.classifyStack(e, e.Status, file, fresh, ferr)
			unsent = append(unsent, i)
		}
		r.classed[e.Path] = s
		r.report.Stacks = append(r.report.Stacks, s)
		e.Class, e.Counts, e.PlanHash, e.Error = s.Class, s.Counts, s.PlanHash, s.Error
		e.Destructive = s.DestructiveAddresses()
		if e.Status == StatusFailed && e.Error == "" {
			e.Error = stackError(StatusFailed)
		}
	}
	if report && r.reporting() {
		r.sendUpdates(context.Background(), unsent)
	}
}

// planFile resolves a stack's plan JSON inside the repository and tells whether this run
// wrote it.
func (r *run) planFile(path string) (file string, fresh bool, err error) {
	file, fi, err := r.root.StackFileInfo(path, r.o.PlanJSON)
	fresh = err == nil && fi != nil && !fi.ModTime().Before(r.res.StartedAt.Add(-time.Second))
	return file, fresh, err
}

// classifyStack classifies one stack's plan; a stack that did not succeed, or whose plan is
// missing, unreadable or stale, is unclassified with the reason.
func (r *run) classifyStack(e *StackEntry, status, file string, fresh bool, ferr error) *plan.Stack {
	unclassified := func(why string) *plan.Stack {
		return &plan.Stack{Name: e.Path, Class: events.ClassUnclassified, Destructive: []plan.Change{}, Changes: []plan.Change{}, Error: why}
	}
	var s *plan.Stack
	switch {
	case status != StatusSucceeded:
		s = unclassified(stackError(status))
	case ferr != nil:
		s = unclassified(ferr.Error())
	case !fresh:
		s = unclassified(fmt.Sprintf("plan file %s was not written by this run (the script must write `show -json` of its saved plan there)", filepath.Join(e.Path, r.o.PlanJSON)))
	default:
		s, _ = plan.ClassifyFile(e.Path, file)
	}
	// By its repository path, as the policy's gates and the claims name it.
	s.Name = e.Path
	s.Why = e.Why
	return s
}

// classifyEarly classifies a stack of `run plan` as soon as it ticks done (its plan JSON is
// written by then) and returns its update to report, so the server shows each stack's class
// while the others still run and the work after terramate returns is only what is left.
func (r *run) classifyEarly(path string) (events.Update, bool) {
	if !r.planning() || r.early[path] != nil {
		return events.Update{}, false
	}
	i, ok := r.entry[path]
	if !ok {
		return events.Update{}, false
	}
	e := &r.res.Stacks[i]
	file, fresh, ferr := r.planFile(path)
	if ferr != nil || !fresh {
		return events.Update{}, false
	}
	s := r.classifyStack(e, StatusSucceeded, file, fresh, nil)
	if s.Class == events.ClassUnclassified {
		return events.Update{}, false // decided again, with terramate's verdict, after the run
	}
	r.early[path] = s
	return r.update(path, StatusSucceeded, s), true
}

// sendUpdates reports the status and classification of the stacks at idx (best-effort), in
// as few requests as the client allows.
func (r *run) sendUpdates(ctx context.Context, idx []int) {
	if !r.reporting() {
		return
	}
	updates := make([]events.Update, 0, len(idx))
	for _, i := range idx {
		if e := r.res.Stacks[i]; r.named(e.Path) {
			updates = append(updates, r.update(e.Path, e.Status, r.classed[e.Path]))
		}
	}
	r.event("Update", r.client.Updates(ctx, updates))
}

// sendAllUpdates reports every stack's status and classification (best-effort).
func (r *run) sendAllUpdates(ctx context.Context) {
	idx := make([]int, len(r.res.Stacks))
	for i := range idx {
		idx[i] = i
	}
	r.sendUpdates(ctx, idx)
}

// update is a stack's Update event, next in the run's seq order.
func (r *run) update(path, status string, s *plan.Stack) events.Update {
	u := s.Event()
	u.ExecutionID, u.Stack, u.Status, u.Seq, u.At = r.o.ExecutionID, path, wireStatus(status), r.seqNext(), r.now().UTC()
	if c, ok := r.carried[path]; ok {
		u.Destructive = c.Destructive[:min(len(c.Destructive), plan.MaxDestructive)]
	}
	return u
}

// wireStatus maps a result status onto the wire's stack status.
func wireStatus(s string) events.StackStatus {
	switch s {
	case StatusSucceeded:
		return events.StackSucceeded
	case StatusFailed:
		return events.StackFailed
	case StatusCancelled:
		return events.StackCancelled
	}
	return events.StackSkipped
}

// gateDenied ends an apply the gate did not allow: the run fails with msg, and no stack is
// applied.
func (r *run) gateDenied(ctx context.Context, msg string) {
	r.fail(newResultError(KindGate, "gate", msg))
	for i := range r.res.Stacks {
		r.res.Stacks[i].Status = StatusNotRun
	}
	r.sendAllUpdates(ctx)
}

// apply asks the gate, then runs the apply script with the leased requester, then revokes.
func (r *run) apply(ctx context.Context) {
	r.begin("gate")
	var stacks []events.StackPlan
	for _, e := range r.res.Stacks {
		if e.Class != events.ClassNoChanges {
			// The class too: the server holds it to the plan's, which decided the gates.
			stacks = append(stacks, events.StackPlan{Stack: e.Path, PlanHash: e.PlanHash, Class: cmp.Or(e.Class, events.ClassUnclassified)})
		}
	}
	if len(stacks) == 0 {
		fmt.Fprintln(r.out, "tfstackplan: no stack has changes; nothing to apply")
		r.sendAllUpdates(ctx)
		return
	}
	if r.refusal() != nil {
		// The server said this execution is not ours: whatever the gate would answer, there is
		// doubt, and doubt denies the apply.
		r.gateDenied(ctx, "the gate was not asked: the server refused this execution: "+r.refused.Error())
		return
	}
	for _, st := range stacks {
		if problem, odd := r.unnamed[st.Stack]; odd {
			// No approval can name it, so none can cover it.
			r.gateDenied(ctx, fmt.Sprintf("the gate was not asked: stack %q would change, and the server takes no such name (it %s)", truncate(st.Stack, 200), problem))
			return
		}
	}
	v := r.client.GateCheck(ctx, events.GateCheck{
		Environment: r.o.Environment, ExecutionID: r.o.ExecutionID, PR: r.o.PR, Repo: r.o.Repo, SHA: r.o.SHA, Stacks: stacks,
		Shard: r.o.Shard,
	})
	g := &GateResult{Verdict: v.Kind.String(), Allowed: v.Allowed(), Requester: v.Requester}
	if v.Err != nil {
		g.Message = v.Err.Error()
	}
	r.res.Gate = g
	asked := r.client.Enabled()
	outcome := "failed"
	switch {
	case asked && r.o.Shard != "":
		// The fan-out's shards share the execution's lease: the merge revokes it once they
		// have all ended (and it expires on its own should the merge never run).
	case asked:
		defer func() { r.revoke(ctx, v.Requester, outcome) }()
	}
	if !v.Allowed() {
		if ctx.Err() != nil {
			r.failCancelled(ctx)
			return
		}
		msg := "the gate did not allow the apply: " + v.Kind.String()
		if g.Message != "" {
			msg += ": " + g.Message
		}
		r.gateDenied(ctx, msg)
		return
	}
	var extra []string
	if v.Requester != "" {
		extra = append(extra, EnvRequester+"="+v.Requester, EnvImpersonate+"="+v.Requester)
	}
	pump := r.startPump(ctx, announcedLongAgo)
	out, runErr := r.scriptRun(ctx, "apply", r.script, extra, pump)
	r.drain(ctx, pump)
	for i := range r.res.Stacks {
		e := &r.res.Stacks[i]
		e.Status = out.status(e.Path, false)
		if e.Status != StatusSucceeded && e.Error == "" {
			e.Error = "the stack's apply " + e.Status
		}
	}
	r.sendAllUpdates(context.WithoutCancel(ctx))
	if !r.scriptFailed("apply", out, runErr, ctx) {
		outcome = "succeeded"
	} else if ctx.Err() != nil {
		outcome = "cancelled"
	}
}

func (r *run) revoke(ctx context.Context, requester, outcome string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), CleanupBudget)
	defer cancel()
	err := r.client.GateRevoke(cctx, events.GateRevoke{
		ExecutionID: r.o.ExecutionID, Environment: r.o.Environment, PR: r.o.PR, Requester: requester, Outcome: outcome,
	})
	if err != nil && !errors.Is(err, runner.ErrCancelRequested) {
		r.warn("GateRevoke: %v (the lease expires on its own)", err)
		return
	}
	if r.res.Gate != nil {
		r.res.Gate.Revoked = true
	}
}

// finish finalizes the execution on the server and writes every output. It runs on every path.
func (r *run) finish(ctx context.Context) {
	r.begin("outputs")
	r.awaitHead()      // when setup failed after asking git
	r.awaitInit(false) // when the flow ended before it said what Init's answer was
	res := r.res
	if res.Error == nil && ctx.Err() != nil {
		r.failCancelled(ctx)
	}
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
	if r.revokeAtFinish {
		requester := ""
		if res.Gate != nil {
			requester = res.Gate.Requester
		}
		r.revoke(ctx, requester, res.Status)
	}
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

// finalize ends the execution on the server, whatever happened.
func (r *run) finalize(ctx context.Context) {
	if r.stopBeat != nil {
		r.stopBeat()
	}
	if r.noFinalize || r.client == nil || !r.client.Enabled() || r.refusal() != nil || !r.inited || r.finalized {
		return
	}
	r.finalized = true
	res := r.res
	status := events.ExecutionSucceeded
	switch res.Status {
	case StatusCancelled:
		status = events.ExecutionCancelled
	case StatusSucceeded:
	default:
		status = events.ExecutionFailed
	}
	f := events.Finalize{ExecutionID: r.o.ExecutionID, Status: status, Class: res.Class, Counts: res.Counts.Events(), FinishedAt: r.now().UTC()}
	if res.Error != nil {
		f.Error = res.Error.Kind + " (" + res.Error.Step + "): " + tailOf(res.Error.Tail, 1024)
	}
	for _, e := range res.Stacks {
		if !r.named(e.Path) {
			continue
		}
		f.Stacks = append(f.Stacks, events.StackResult{Stack: e.Path, Status: wireStatus(e.Status), Class: e.Class, Counts: e.Counts.Events(), PlanHash: e.PlanHash,
			Drifted: e.Drifted != nil && *e.Drifted})
	}
	body, err := json.Marshal(f)
	if err == nil {
		// A server gone a moment ago (restarted) would leave the execution running: Finalize is
		// tried again when the breaker's cool-down ends within the budget.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalizeBudget(len(body)))
		defer cancel()
		err = r.client.FinalizeJSONRetrying(cctx, body)
	}
	if err != nil && !errors.Is(err, runner.ErrCancelRequested) {
		r.warn("Finalize not reported: %v", err)
	}
}

// heartbeat tells the server every RunOptions.Heartbeat that the run goes on, from Init's
// answer (unless it refused the execution) until the returned stop is called: the server
// fails an execution it hears nothing of for a while (`serve --stale-after`). A heartbeat goes
// through the client's breaker, so a dead server costs nothing; a cancel it brings back stops
// the run as any event's does.
func (r *run) heartbeat(ctx context.Context, announced <-chan struct{}) (stop func()) {
	every := r.o.Heartbeat
	if every <= 0 {
		every = HeartbeatInterval
	}
	// Not the run's context: a cancelled run still drains and finalizes, and is still running.
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-announced:
		case <-hctx.Done():
			return
		}
		if r.silenced() != nil {
			return
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-hctx.Done():
				return
			case <-t.C:
			}
			if err := r.client.Heartbeat(hctx, r.o.ExecutionID); errors.Is(err, runner.ErrCancelRequested) {
				r.cancelRun(err)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// finalizeBudget is the time a Finalize of size bytes gets after the run: CleanupBudget, and
// for each attempt the upload time the client gives each attempt (a Finalize of thousands of
// stacks is megabytes; capped at CleanupBudget it had no time for a retry).
func finalizeBudget(size int) time.Duration {
	return runner.SizedBudget(CleanupBudget, size)
}

// writeOutputs writes the terminal summary, the GitHub outputs, the comment file and the result.
func (r *run) writeOutputs() {
	res := r.res
	// A line per stack and per destroyed resource, the plans and the annotations: one write to
	// stdout, not one each.
	out := bufio.NewWriterSize(r.out, 64<<10)
	if r.report != nil {
		r.report.Environment, r.report.Dir, r.report.Notes = res.Environment, r.tierRel, r.notes()
	}
	if r.report != nil && !r.o.DryRun {
		fmt.Fprintln(out)
		if err := plan.Text(out, r.report, r.o.Color); err != nil {
			r.warn("summary: %v", err)
		}
	}
	if res.Matrix != nil {
		// stdout is the matrix's one JSON line: the summary goes to stderr.
		r.terminalSummary(r.errOut)
		line, _ := jsonMarshalNoHTML(res.Matrix.GitHub())
		fmt.Fprintf(out, "%s\n", line)
	} else {
		r.terminalSummary(out)
		r.driftSummary(out)
	}
	if r.gh.Actions {
		r.annotateNeeds(out)
		if res.Error != nil && res.Error.Kind != KindScript {
			annotateError(out, "tfstackplan "+res.Op, res.Error.Kind+" error in "+res.Error.Step+": "+tailOf(res.Error.Tail, 1024))
		}
		// The warnings were printed as they came, some inside the script run's folded group:
		// the annotations show them on the run's page too.
		for i, w := range res.Warnings {
			if i == maxWarningAnnotations {
				annotate(out, "warning", "tfstackplan "+res.Op, fmt.Sprintf("%d more warnings: see the result document", len(res.Warnings)-i))
				break
			}
			annotate(out, "warning", "tfstackplan "+res.Op, w)
		}
	}
	_ = out.Flush()
	r.writeIssueFile()
	if r.report != nil {
		// A shard's comment would be a part of the plan: the merge writes the comment.
		if r.o.CommentFile != "" && r.o.Shard == "" {
			if err := writeFileAtomic(r.o.CommentFile, []byte(plan.Comment(r.report)), 0o644); err != nil {
				r.warn("comment file: %v", err)
			}
		}
		if r.gh.StepSummary != "" {
			if err := appendFile(r.gh.StepSummary, plan.Markdown(r.report)); err != nil {
				r.warn("step summary: %v", err)
			}
		}
	}
	path := r.o.ResultPath
	if path == "" {
		path = DefaultResultPath(r.getenv)
	}
	if r.gh.Output != "" {
		var changed []string
		for _, e := range res.Stacks {
			if e.Class != events.ClassNoChanges {
				changed = append(changed, e.Stack)
			}
		}
		if changed == nil {
			changed = []string{}
		}
		cj, _ := jsonMarshalNoHTML(changed)
		abs, _ := filepath.Abs(path)
		kv := [][2]string{
			{"execution", res.Execution}, {"status", res.Status}, {"class", string(res.Class)},
			{"has-changes", fmt.Sprint(res.HasChanges)}, {"has-destructive", fmt.Sprint(res.HasDestructive)},
			{"changed-stacks", string(cj)}, {"result", abs}, {"execution-url", res.ExecutionURL},
		}
		if r.o.CommentFile != "" && r.o.Shard == "" {
			kv = append(kv, [2]string{"comment-file", r.o.CommentFile})
		}
		if res.Matrix != nil {
			mj, _ := jsonMarshalNoHTML(res.Matrix.GitHub())
			kv = append(kv, [2]string{"matrix", string(mj)}, [2]string{"shards", fmt.Sprint(len(res.Matrix.Shards))})
		}
		kv = append(kv, r.driftOutputs()...)
		if err := writeOutputs(r.gh.Output, kv); err != nil {
			r.warn("GITHUB_OUTPUT: %v", err)
		}
	}
	if err := WriteResult(path, res); err != nil {
		res.Warnings = append(res.Warnings, "result document: "+err.Error())
		fmt.Fprintln(r.errOut, "tfstackplan: error: could not write the result document:", err)
	}
}

// terminalSummary prints one line per stack and names every destroyed, replaced and forgotten
// resource by address, then the outcome.
func (r *run) terminalSummary(w io.Writer) {
	res := r.res
	fmt.Fprintf(w, "\ntfstackplan %s %s: %s", res.Op, res.Environment, res.Status)
	if res.ExecutionURL != "" {
		fmt.Fprintf(w, " (%s)", res.ExecutionURL)
	}
	fmt.Fprintln(w)
	for _, e := range res.Stacks {
		cls := string(e.Class)
		if cls == "" {
			cls = "-"
		}
		fmt.Fprintf(w, "  %-10s %-13s %s\n", e.Status, cls, plan.Printable(e.Path))
		if s := r.classed[e.Path]; s != nil {
			// The result document names them all; a terminal gets the first MaxDestructive.
			list, more := s.Destructive, s.DestructiveOmitted
			if len(list) > plan.MaxDestructive {
				list, more = list[:plan.MaxDestructive], more+len(list)-plan.MaxDestructive
			}
			for _, c := range list {
				fmt.Fprintf(w, "      %s\n", c.Head())
			}
			if more > 0 {
				fmt.Fprintf(w, "      … and %d more destructive changes (the result document names them all)\n", more)
			}
		}
	}
	if res.Gate != nil {
		fmt.Fprintf(w, "gate: %s", res.Gate.Verdict)
		if res.Gate.Requester != "" {
			fmt.Fprintf(w, " (requester %s)", res.Gate.Requester)
		}
		fmt.Fprintln(w)
	}
	r.needsSummary(w)
	if res.Error != nil {
		fmt.Fprintf(w, "error (%s, %s): %s\n", res.Error.Kind, res.Error.Step, plan.PrintableText(tailOf(res.Error.Tail, 2048)))
	}
}

// truncate cuts s to n bytes, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
