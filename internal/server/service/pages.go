package service

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// What the web pages read besides the API's: the gates a plan execution requires with the
// content an approval would cover, the applies that used a plan's approvals, and when each
// stack ran.

// PlanGates is what a plan execution's page shows of its approvals.
type PlanGates struct {
	// Latest is the PR's latest plan in the environment ("" when it has none): only that plan
	// can be approved.
	Latest string
	// NotApplicable says why the plan cannot be applied, so not approved ("" when it can).
	NotApplicable string
	// Gates are the gates the plan requires under the policy, in the policy's order.
	Gates []PlanGate
}

// PlanGate is one gate a plan requires.
type PlanGate struct {
	// Gate is the gate; Satisfied when an active grant approved the plan's content on its
	// stacks.
	api.Gate
	// Stacks are the gate's stacks as the plan has them (class, changes, content hash): what an
	// approval covers.
	Stacks []api.StackState
	// Grants are the gate's active grants for the PR (any plan's), newest first.
	Grants []api.Grant
}

// GatesOfPlan returns the gates plan execution id requires, as SatisfyGate would find them,
// with what each covers and the grants active on it. An execution that is no PR's plan
// requires none (nil).
func (s *Service) GatesOfPlan(ctx context.Context, caller Caller, id string) (*PlanGates, error) {
	var out *PlanGates
	err := s.Store.Read(ctx, func(tx store.Tx) error {
		plan, err := tx.Execution(id)
		if err != nil {
			return err
		}
		if !caller.allows(plan.Repo) {
			return fmt.Errorf("%w: execution %q", store.ErrNotFound, id)
		}
		var stacks []store.Stack
		if plan.Op == api.ExecutionOpPlan && plan.PR > 0 {
			if stacks, err = tx.Stacks(id); err != nil {
				return err
			}
		}
		out, err = s.gatesOfPlan(tx, plan, stacks)
		return err
	})
	return out, err
}

// gatesOfPlan is GatesOfPlan of plan, whose stacks are stacks, in tx.
func (s *Service) gatesOfPlan(tx store.Tx, plan *store.Execution, stacks []store.Stack) (*PlanGates, error) {
	if plan.Op != api.ExecutionOpPlan || plan.PR <= 0 {
		return nil, nil
	}
	key := store.PRKey{Repo: plan.Repo, Environment: plan.Environment, PR: plan.PR}
	out := &PlanGates{}
	switch latest, err := tx.LatestPlan(key); {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		return nil, err
	default:
		out.Latest = latest.ExecutionID
	}
	err := applicablePlan(plan)
	if err == nil {
		err = applicableStacks(plan, stacks)
	}
	if err != nil {
		out.NotApplicable = err.Error()
	}
	gates := s.gatesOf(plan, stacks)
	if len(gates) == 0 {
		return out, nil
	}
	active, err := activeGrants(tx, key, s.Now())
	if err != nil {
		return nil, err
	}
	byName := make(map[string]store.Stack, len(stacks))
	for _, st := range stacks {
		byName[st.Stack] = st
	}
	for _, g := range gates {
		pg := PlanGate{Gate: g, Grants: active[keyOf(g)]}
		for _, name := range g.Stacks {
			pg.Stacks = append(pg.Stacks, byName[name].StackState)
		}
		for _, gr := range pg.Grants {
			if _, ok := covers(gr, g.Stacks, func(n string) string { return byName[n].PlanHash }); ok {
				pg.Satisfied = true
			}
		}
		out.Gates = append(out.Gates, pg)
	}
	return out, nil
}

// Apply is an apply execution whose gate check was allowed over a plan.
type Apply struct {
	// ExecutionID is the apply's execution id; Plan the plan execution it decided over.
	ExecutionID, Plan string
	// GrantIDs are the grants its decision used.
	GrantIDs []int64
	// Outcome is how its lease ended ("" while it holds).
	Outcome string
}

// AppliesOf returns the applies whose gate check was allowed over the plan executions ids, of
// the repositories the caller may read: a gate whose plan was applied was satisfied, though the
// apply's end released the grants it used.
func (s *Service) AppliesOf(ctx context.Context, caller Caller, ids []string) ([]Apply, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	var out []Apply
	err := s.Store.Read(ctx, func(tx store.Tx) error {
		leases, err := tx.LeasesOfPlans(ids)
		for _, l := range leases {
			if caller.allows(l.Repo) {
				out = append(out, Apply{ExecutionID: l.ExecutionID, Plan: l.PlanID, GrantIDs: slices.Clone(l.GrantIDs), Outcome: l.Outcome})
			}
		}
		return err
	})
	return out, err
}

// ExecutionPage is what an execution's page shows, read at once.
type ExecutionPage struct {
	Execution *api.Execution
	// Spans are when each stack had its first and last phase event.
	Spans map[string]store.Span
	// Gates are the gates of the execution's plan (GatesOfPlan; nil: not a plan).
	Gates *PlanGates
}

// ExecutionPage reads execution id for its page: the spans of the stacks spansOf chooses among
// the execution's (nil: of every stack) and, withGates, the gates its plan requires.
func (s *Service) ExecutionPage(ctx context.Context, caller Caller, id string, withGates bool, spansOf func([]api.StackState) []string) (*ExecutionPage, error) {
	var out ExecutionPage
	err := s.Store.Read(ctx, func(tx store.Tx) (err error) {
		if out.Execution, err = execution(tx, caller, id); err != nil {
			return err
		}
		if out.Spans, err = tx.StackSpans(id, spansOf(out.Execution.Stacks)); err != nil || !withGates {
			return err
		}
		plan, err := tx.Execution(id)
		if err != nil {
			return err
		}
		stacks := make([]store.Stack, len(out.Execution.Stacks))
		for i, st := range out.Execution.Stacks {
			stacks[i] = store.Stack{StackState: st}
		}
		out.Gates, err = s.gatesOfPlan(tx, plan, stacks)
		return err
	})
	return &out, err
}
