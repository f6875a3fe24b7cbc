package job

// The job's use of the LogPump: the poster that waits for Init, starting the pump over the
// run's stacks, and the bounded drain after terramate returns.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tfstackplan/tfstackplan/runner"

	"github.com/tfstackplan/tfstackplan/events"
)

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
// reach the server. A panic in the drain is the run's error.
func (r *run) drain(ctx context.Context, p *runner.LogPump) *ResultError {
	if p == nil {
		return nil
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
	rep, err := d.call.wait()
	if perr := panicError(step, err); perr != nil {
		return perr
	}
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
	return nil
}
