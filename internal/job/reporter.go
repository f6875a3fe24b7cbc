package job

// The reporter: what the job tells the control plane about its execution, and the state
// that goes with it. It owns Init's answer (sent as the scripts start, awaited only where it
// matters), the sequence numbers, the best-effort events' warnings, the heartbeat and
// Finalize with its retry. The run builds the events (report.go); the reporter sends them.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/runner"
)

// reporter reports one execution to the control plane (a disabled client: nowhere).
type reporter struct {
	client *runner.Client
	// execID is the execution it reports for (fixed when Init goes out).
	execID string
	// every is the heartbeat's interval (zero: HeartbeatInterval).
	every time.Duration
	// warnf says a warning (the run's warn); clock is the run's clock.
	warnf func(format string, a ...any)
	clock func() time.Time
	// cancelRun stops the run: a cancel the server answers an event with, a panic sending Init.
	cancelRun context.CancelCauseFunc

	seq        int64
	seqMu      sync.Mutex // guards seq and unreported
	unreported map[string]int
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
}

// seqNext orders the runner's own events for one execution.
func (r *reporter) seqNext() int64 {
	r.seqMu.Lock()
	defer r.seqMu.Unlock()
	r.seq = max(r.seq+1, r.clock().UnixNano())
	return r.seq
}

// event handles a best-effort call's error: a cancel from the server stops the run, anything
// else is a warning.
func (r *reporter) event(op string, err error) {
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
		r.warnf("%s not reported: %v", op, err)
	}
}

// warnUnreported sums up the failed reports of each kind after the first (a report is one
// request, which for a batch operation carries several events).
func (r *reporter) warnUnreported() {
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
		r.warnf("%d more %s reports failed", counts[op]-1, op)
	}
}

// sendInit sends the execution's Init (body, or encErr when it could not be encoded) on its
// own goroutine and starts the heartbeat; the returned channel is closed once Init was
// answered. Finalize follows even when Init seemed to fail: a slow server may have stored it
// anyway, and no execution may stay running there. It also waits for Init's answer (refusal).
func (r *reporter) sendInit(ctx context.Context, body []byte, encErr error) <-chan struct{} {
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
	return announced
}

// errInitPanicked stops the run, and what is sent for it, when sending Init panicked.
var errInitPanicked = errors.New("sending the execution's Init panicked")

// refusal waits for Init's answer and returns the server's refusal of the execution (nil: not
// refused, or no Init was sent). Init's call is bounded by the client's call budget.
func (r *reporter) refusal() error {
	if r.announced == nil {
		return nil
	}
	<-r.announced
	return r.refused
}

// silenced waits for Init's answer and returns why no phase, update or log is sent for the
// execution: the server refused it, or sending Init panicked (Finalize is still sent then,
// lest the execution stay running should Init have arrived). nil: they are sent.
func (r *reporter) silenced() error {
	if err := r.refusal(); err != nil {
		return err
	}
	if r.initPanic != nil {
		return errInitPanicked
	}
	return nil
}

// sayInit waits for Init's answer and says once what it was: a refusal or a failure is a
// warning (a panic is initError's). The tick relay's first post calls it, so that the warning
// comes early in the log, and initError after the script run: never two goroutines at once.
func (r *reporter) sayInit() {
	if r.refusal(); r.announced == nil || r.initSaid || r.initPanic != nil {
		return
	}
	r.initSaid = true
	if r.refused != nil {
		r.warnf("the server refused this execution (%v): its phases, updates, logs and Finalize are not sent", r.refused)
	} else {
		r.event("Init", r.initErr)
	}
}

// initError waits for Init's answer and says what it was (sayInit). A panic while sending Init
// is the run's error (internal, step init); nil otherwise.
func (r *reporter) initError() *ResultError {
	r.sayInit()
	if p := r.initPanic; p != nil {
		return newResultError(KindInternal, "init", "panic: "+p.String())
	}
	return nil
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
func (r *reporter) reporting() bool {
	return r.client.Enabled() && r.silenced() == nil
}

// heartbeat tells the server every r.every (RunOptions.Heartbeat) that the run goes on, from Init's
// answer (unless it refused the execution) until the returned stop is called: the server
// fails an execution it hears nothing of for a while (`serve --stale-after`). A heartbeat goes
// through the client's breaker, so a dead server costs nothing; a cancel it brings back stops
// the run as any event's does.
func (r *reporter) heartbeat(ctx context.Context, announced <-chan struct{}) (stop func()) {
	every := r.every
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
			if err := r.client.Heartbeat(hctx, r.execID); errors.Is(err, runner.ErrCancelRequested) {
				r.cancelRun(err)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// stopHeartbeat ends the heartbeats, if they were started.
func (r *reporter) stopHeartbeat() {
	if r.stopBeat != nil {
		r.stopBeat()
	}
}

// finalizes reports whether the execution is to be finalized: a server is configured, Init went
// out and was not refused, and it was not finalized already. It waits for Init's answer.
func (r *reporter) finalizes() bool {
	return r.client != nil && r.client.Enabled() && r.refusal() == nil && r.inited && !r.finalized
}

// sendFinalize ends the execution on the server with f, once; a failure is a warning.
func (r *reporter) sendFinalize(ctx context.Context, f events.Finalize) {
	r.finalized = true
	body, err := json.Marshal(f)
	if err == nil {
		// A server gone a moment ago (restarted) would leave the execution running: Finalize is
		// tried again when the breaker's cool-down ends within the budget.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalizeBudget(len(body)))
		defer cancel()
		err = r.client.FinalizeJSONRetrying(cctx, body)
	}
	if err != nil && !errors.Is(err, runner.ErrCancelRequested) {
		r.warnf("Finalize not reported: %v", err)
	}
}

// finalizeBudget is the time a Finalize of size bytes gets after the run: CleanupBudget, and
// for each attempt the upload time the client gives each attempt (a Finalize of thousands of
// stacks is megabytes; capped at CleanupBudget it had no time for a retry).
func finalizeBudget(size int) time.Duration {
	return runner.SizedBudget(CleanupBudget, size)
}

// goPanic is a panic recovered in one of the flow's goroutines, with the stack it happened
// on; the flow takes it as an error (panicError).
type goPanic struct {
	value any
	stack []byte
}

func (g goPanic) String() string {
	return fmt.Sprintf("%v\n\n[raised in another goroutine]\n%s", g.value, g.stack)
}

// Error makes a goPanic the error of the call it ended (call.wait).
func (g *goPanic) Error() string { return g.String() }

// panicError is the run's internal error in step when err is a panic recovered on another
// goroutine (a *goPanic); nil otherwise.
func panicError(step string, err error) *ResultError {
	var gp *goPanic
	if errors.As(err, &gp) {
		return newResultError(KindInternal, step, "panic: "+gp.String())
	}
	return nil
}

// catchPanic, deferred by a goroutine of the flow, recovers its panic into *p.
func catchPanic(p **goPanic) {
	if v := recover(); v != nil {
		*p = &goPanic{value: v, stack: debug.Stack()}
	}
}
