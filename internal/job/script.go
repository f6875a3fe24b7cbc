package job

// One terramate script run over the selected stacks: the scripts' environment, the job log,
// the tick relay, and what a failure of the run means.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/tfstackplan/tfstackplan/runner"

	"github.com/tfstackplan/tfstackplan/events"
)

// terramateError is the run's error for a terramate failure in step (or for the cancellation
// that caused it).
func (r *run) terramateError(ctx context.Context, step string, err error) error {
	if ctx.Err() != nil {
		return r.cancelled(ctx, r.step, "")
	}
	return newResultError(KindTerramate, step, err.Error())
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

// cancelled is the run's error when it was cancelled during step (and the signal that
// cancelled it, if any, goes on the result); detail is added to the message.
func (r *run) cancelled(ctx context.Context, step, detail string) error {
	cause := context.Cause(ctx)
	var sc runner.SignalCause
	if errors.As(cause, &sc) {
		r.res.Signal = sc.Signal
	}
	msg := "the run was cancelled"
	if cause != nil && !errors.Is(cause, context.Canceled) {
		msg += ": " + cause.Error()
	}
	return newResultError(KindCancelled, step, msg+detail)
}

func (r *run) dryRun(ctx context.Context) error {
	r.begin("dry-run")
	w := newScriptWatcher(r.out)
	err := r.tm.ScriptRun(ctx, w, runner.ScriptRunOptions{
		Script: r.script, Changed: !r.o.All, Base: r.o.Base, Parallel: r.o.Parallel,
		ContinueOnError: r.o.ContinueOnError, DryRun: true, Env: r.scriptEnv("", nil),
	})
	if err != nil {
		return r.terramateError(ctx, "dry-run", err)
	}
	return nil
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

// scriptRun runs one terramate script over the selected stacks and says what happened to each
// (out), with terramate's own error (runErr); pump (nil: none) tails their logs, and its drain
// starts as soon as terramate returns. err is the run's own failure: a panic in the tick relay.
func (r *run) scriptRun(ctx context.Context, step, script string, extraEnv []string, pump *runner.LogPump) (scriptOutcome, error, error) {
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
	stopRelay := func() *ResultError { return nil }
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
	var broken error // the relay's panic
	if relayErr := stopRelay(); relayErr != nil {
		broken = relayErr
	}
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
	return out, runErr, broken
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
func (r *run) relayTicks(ctx context.Context, t *runner.TickReader, live bool, jl *jobLog) (stop func() *ResultError) {
	if !r.client.Enabled() && !live && jl == nil {
		var once sync.Once
		return func() *ResultError { once.Do(func() { t.Next() }); return nil }
	}
	// post relays recs; a panic while posting the phases is returned.
	post := func(recs []runner.TickRecord) *goPanic {
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
			if gp, ok := err.(*goPanic); ok {
				return gp
			}
			r.event("Phase", err)
			r.event("Update", r.client.Updates(pctx, updates))
		}
		return nil
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	// A panic here (classifying a plan, say) is stop's error, the run's.
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
				relayPanic = post(t.Next())
				return
			case <-tick.C:
				if relayPanic = post(t.Next()); relayPanic != nil {
					return
				}
			}
		}
	}()
	var once sync.Once
	var err *ResultError
	return func() *ResultError {
		once.Do(func() {
			close(done)
			<-finished
			if relayPanic != nil {
				err = panicError(r.step, relayPanic)
			}
		})
		return err
	}
}

// scriptError is what a script run's failure means for the run: the error that stops it here
// (nil: the run goes on).
func (r *run) scriptError(ctx context.Context, step string, out scriptOutcome, runErr error) error {
	if ctx.Err() != nil {
		// Named after the step interrupted, not the classification that followed it.
		return r.cancelled(ctx, step, r.interruptedLocks(out, errors.Is(runErr, runner.ErrKilledAfterGrace)))
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
		return newResultError(kind, step, msg)
	}
	if len(failedStacks) > 0 {
		return newResultError(KindScript, step, "failed stacks: "+strings.Join(failedStacks, ", "))
	}
	var unclassified []string
	for _, e := range r.res.Stacks {
		if e.Class == events.ClassUnclassified {
			unclassified = append(unclassified, e.Stack+": "+e.Error)
		}
	}
	if len(unclassified) > 0 {
		return newResultError(KindClassify, step, "plans that could not be read:\n"+strings.Join(unclassified, "\n"))
	}
	return nil
}
