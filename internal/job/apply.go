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
