package job

// The job's first step: the configuration (tfstackplan.hcl, the flags over it), the
// directories, the repository, the server client and the GitHub context.

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/runner"
)

// setup resolves the configuration: the environment block, the flags over it, the directory,
// the server client and the GitHub context.
func (r *run) setup(context.Context) error {
	o := &r.o
	if o.Op != OpPlan && o.Op != OpApply {
		if err := r.setupDrift(); err != nil {
			return err
		}
	}
	if strings.TrimSpace(o.Environment) == "" {
		return newResultError(KindUsage, "config", "--environment is required")
	}
	if o.Parallel < 0 {
		return newResultError(KindUsage, "config", fmt.Sprintf("--parallel must not be negative, got %d", o.Parallel))
	}
	if o.PR < 0 {
		return newResultError(KindUsage, "config", fmt.Sprintf("--pr must be a positive pull request number, got %d", o.PR))
	}
	if msg := cmp.Or(fanOutUsage(o), rerunUsage(o)); msg != "" {
		return newResultError(KindUsage, "config", msg)
	}
	wd := o.WorkDir
	if wd == "" {
		var err error
		if wd, err = os.Getwd(); err != nil {
			return newResultError(KindConfig, "config", err.Error())
		}
	}
	wd, err := filepath.Abs(wd)
	if err != nil {
		return newResultError(KindConfig, "config", err.Error())
	}
	if r.root, err = runner.NewStackRoot(runner.FindRepoRoot(wd)); err != nil {
		return newResultError(KindConfig, "config", err.Error())
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
		return newResultError(KindConfig, "config", err.Error())
	}
	block := runner.Environment{Name: o.Environment}
	if cfg != nil {
		if block, err = cfg.Environment(o.Environment); err != nil {
			return newResultError(KindConfig, "config", err.Error())
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
		return newResultError(KindConfig, "config", fmt.Sprintf("terramate directory %s: %v", r.tierAbs, err))
	}
	rel, err := filepath.Rel(r.root.Dir(), r.tierAbs)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return newResultError(KindConfig, "config", fmt.Sprintf("terramate directory %s is outside the repository %s", r.tierAbs, r.root.Dir()))
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
		return newResultError(KindUsage, "config", fmt.Sprintf("--lock-timeout %q is not a duration such as 0s, 30s or 5m", o.LockTimeout))
	}
	for name, v := range map[string]string{"--log-file": o.LogFile, "--plan-file": o.PlanJSON, "--plan-out": o.PlanOut} {
		if strings.ContainsAny(v, `/\`) || v == "." || v == ".." || strings.ContainsRune(v, 0) {
			return newResultError(KindUsage, "config", fmt.Sprintf("%s %q must be a plain file name inside each stack directory", name, v))
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
		return rerr
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
		if err == nil {
			r.client = c
		} else if err := r.unusable(err, fmt.Sprintf("the tfstackplan server cannot be used, reporting is off: %v", err)); err != nil {
			return err
		}
	}
	if r.client.Enabled() && o.Repo == "" {
		if err := r.unusable(ErrNoRepo, ErrNoRepo.Error()+"; reporting disabled"); err != nil {
			return err
		}
	}
	if r.client.Enabled() {
		r.res.Server = r.client.BaseURL()
		r.res.ExecutionURL = executionURL(r.res.Server, o.ExecutionID)
	}
	if o.Op == OpApply && o.PR <= 0 && r.client.Enabled() {
		return newResultError(KindUsage, "config", "run apply needs the pull request whose plan was approved: pass --pr (or run on a pull_request event)")
	}

	r.tm = o.Terramate
	if r.tm == nil {
		r.tm = &runner.Terramate{}
	}
	tm := *r.tm
	tm.Dir = r.tierAbs
	r.tm = &tm
	return nil
}

// unusable deals with a configured server the run cannot use, for the reason err: an apply is
// denied (the gate cannot be asked, and an apply never runs unchecked) and unusable returns
// the denial; a plan goes on with a client that reports nothing, after warning (nil).
func (r *run) unusable(err error, warning string) error {
	if r.o.Op == OpApply {
		r.res.Gate = &GateResult{Verdict: runner.VerdictNotSatisfied.String(), Message: err.Error()}
		return newResultError(KindGate, "config", "the gate cannot be checked: "+err.Error())
	}
	r.warn("%s", warning)
	r.client = runner.BrokenClient(err)
	return nil
}

// awaitHead records the commit git named for HEAD, once setup's call (if any) has answered; a
// panic in the call is the run's error.
func (r *run) awaitHead() *ResultError {
	if r.head == nil {
		return nil
	}
	sha, err := r.head.wait()
	r.head = nil
	if perr := panicError(r.step, err); perr != nil {
		return perr
	}
	r.o.SHA, r.res.SHA = sha, sha
	return nil
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
