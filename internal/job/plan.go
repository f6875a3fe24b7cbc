package job

// run plan: its steps. run drift is run plan over every stack (drift.go adds what it records);
// run apply starts with the same steps (apply.go).

import "context"

// planSteps are run plan's steps, in order. A fan-out's matrix job stops once it has announced
// the execution, and a dry run once it has printed what terramate would run.
func (r *run) planSteps() []step {
	o := &r.o
	steps := []step{r.setup, r.discoverAndHead}
	if o.RerunFailed {
		steps = append(steps, r.selectRerun)
	}
	if o.Matrix > 0 {
		return append(steps, r.matrix)
	}
	if o.Shard != "" {
		steps = append(steps, r.selectShard)
	}
	if o.DryRun {
		return append(steps, r.dryRun)
	}
	return append(steps, r.announce, r.plan)
}

// plan runs the plan script (the work of run plan and run drift; for run apply the fresh plan
// the gate checks) and classifies the stacks' plans.
func (r *run) plan(ctx context.Context) error {
	script := r.planScr
	if r.planning() {
		script = r.script
	}
	outcome, runErr, err := r.scriptRun(ctx, "plan", script, nil, r.pump)
	if err != nil {
		return err
	}
	if err := r.initError(); err != nil {
		return err
	}
	if ctx.Err() == nil || r.planning() {
		r.classify(outcome, r.planning())
	}
	return r.scriptError(ctx, "plan", outcome, runErr)
}
