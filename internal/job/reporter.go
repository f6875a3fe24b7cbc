package job

// Reporting to the control plane: Init (sent as the scripts start, its answer awaited only
// where it matters), sequence numbers, best-effort events, the heartbeat and Finalize.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/runner"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/plan"
)

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

// announce sends the execution's Init and starts the log pump (r.pump; none without a server or
// stacks). Init is not waited for: the scripts start while it is in flight (a slow server
// costs the build no time here), and everything sent for the execution waits for its answer
// (see refusal and cancellingPoster). initError, on the flow's goroutine, says what the answer
// was.
func (r *run) announce(ctx context.Context) error {
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
	r.pump = r.startPump(ctx, announced)
	return nil
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
// warning (a panic is initError's). The tick relay's first post calls it, so that the warning
// comes early in the log, and initError after the script run: never two goroutines at once.
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

// initError waits for Init's answer and says what it was (sayInit). A panic while sending Init
// is the run's error (internal, step init); nil otherwise.
func (r *run) initError() error {
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
