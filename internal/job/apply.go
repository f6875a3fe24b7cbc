package job

// run apply's own steps: the gate check (fail-closed), the apply script run with the leased
// requester, and the revoke.

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/tfstackplan/tfstackplan/runner"

	"github.com/tfstackplan/tfstackplan/events"
)

// applySteps are run apply's steps: run plan's (a fresh plan, whose hashes the gate checks),
// then the gate check, the apply script run and the revoke (apply). A fan-out's matrix job and
// a dry run apply nothing.
func (r *run) applySteps() []step {
	steps := r.planSteps()
	if r.o.Matrix > 0 || r.o.DryRun {
		return steps
	}
	return append(steps, r.apply)
}

// gateDenied ends an apply the gate did not allow: no stack is applied, and the run fails with
// msg (the error returned).
func (r *run) gateDenied(ctx context.Context, msg string) error {
	for i := range r.res.Stacks {
		r.res.Stacks[i].Status = StatusNotRun
	}
	r.sendAllUpdates(ctx)
	return newResultError(KindGate, "gate", msg)
}

// lease is the gate's lease a job holds until it revokes it.
type lease struct {
	requester string // the service account the gate leased ("" : none named)
}

// apply asks the gate, then runs the apply script with the leased requester, then revokes the
// lease (finish revokes one still held, should the apply have panicked).
func (r *run) apply(ctx context.Context) error {
	// The plan script's logs, before the apply script's start.
	if err := r.drain(ctx, r.pump); err != nil {
		return err
	}
	r.pump = nil
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
		return nil
	}
	if r.refusal() != nil {
		// The server said this execution is not ours: whatever the gate would answer, there is
		// doubt, and doubt denies the apply.
		return r.gateDenied(ctx, "the gate was not asked: the server refused this execution: "+r.refused.Error())
	}
	for _, st := range stacks {
		if problem, odd := r.unnamed[st.Stack]; odd {
			// No approval can name it, so none can cover it.
			return r.gateDenied(ctx, fmt.Sprintf("the gate was not asked: stack %q would change, and the server takes no such name (it %s)", truncate(st.Stack, 200), problem))
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
	// The fan-out's shards share the execution's lease: the merge revokes it once they have
	// all ended (and it expires on its own should the merge never run).
	if r.client.Enabled() && r.o.Shard == "" {
		r.lease = &lease{requester: v.Requester}
	}
	if !v.Allowed() {
		var err error
		if ctx.Err() != nil {
			err = r.cancelled(ctx, r.step, "")
		} else {
			msg := "the gate did not allow the apply: " + v.Kind.String()
			if g.Message != "" {
				msg += ": " + g.Message
			}
			err = r.gateDenied(ctx, msg)
		}
		r.revokeLease(ctx, "failed")
		return err
	}
	var extra []string
	if v.Requester != "" {
		extra = append(extra, EnvRequester+"="+v.Requester, EnvImpersonate+"="+v.Requester)
	}
	pump := r.startPump(ctx, announcedLongAgo)
	out, runErr, err := r.scriptRun(ctx, "apply", r.script, extra, pump)
	if derr := r.drain(ctx, pump); err == nil && derr != nil {
		err = derr
	}
	if err != nil {
		r.revokeLease(ctx, "failed")
		return err
	}
	for i := range r.res.Stacks {
		e := &r.res.Stacks[i]
		e.Status = out.status(e.Path, false)
		if e.Status != StatusSucceeded && e.Error == "" {
			e.Error = "the stack's apply " + e.Status
		}
	}
	r.sendAllUpdates(context.WithoutCancel(ctx))
	err = r.scriptError(ctx, "apply", out, runErr)
	outcome := "succeeded"
	switch {
	case err != nil && ctx.Err() != nil:
		outcome = "cancelled"
	case err != nil:
		outcome = "failed"
	}
	r.revokeLease(ctx, outcome)
	return err
}

// revokeLease revokes the lease the job holds, if any, saying how the apply ended.
func (r *run) revokeLease(ctx context.Context, outcome string) {
	if r.lease == nil {
		return
	}
	l := r.lease
	r.lease = nil
	r.revoke(ctx, l.requester, outcome)
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
