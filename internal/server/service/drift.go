package service

import (
	"context"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// OpDrift is the op of a drift execution: a scheduled plan of every stack of an environment,
// of no pull request, whose Finalize records each stack's drift check.
const OpDrift = api.ExecutionOpDrift

// Limits of a drift history read (GET /drift?stack=).
const (
	DefaultDriftLimit = 50
	MaxDriftLimit     = 500
)

// driftChecks are the drift checks a drift execution e's Finalize records: one per stack it
// finalized as planned (succeeded) or failed; a stack skipped or cancelled was not checked, and
// its latest check stays. A stack drifted when it planned and the runner said so, or its class
// is a change: a runner that drops the flag cannot hide a change its class shows.
func driftChecks(e *store.Execution, in *api.Finalize) []api.DriftCheck {
	out := make([]api.DriftCheck, 0, len(in.Stacks))
	for _, r := range in.Stacks {
		planned := r.Status == events.StackSucceeded
		if !planned && r.Status != events.StackFailed {
			continue
		}
		out = append(out, api.DriftCheck{
			Repo: e.Repo, Environment: e.Environment, Stack: r.Stack, ExecutionID: e.ExecutionID,
			CheckedAt: e.FinishedAt, Status: r.Status, Class: r.Class, Counts: r.Counts,
			Drifted: planned && (r.Drifted || changed(r.Class) && r.Class != events.ClassUnclassified),
		})
	}
	return out
}

// Drift lists the drift checks of environment env in repo (as caller may read it, see
// Caller.ReadRepo): each stack's latest one, or with stack one stack's history, newest first,
// at most limit (nil: DefaultDriftLimit).
func (s *Service) Drift(ctx context.Context, caller Caller, repo, env, stack string, limit *int) ([]api.DriftCheck, error) {
	if err := checkName("environment", env); err != nil {
		return nil, err
	}
	n, err := Limit(limit, DefaultDriftLimit, MaxDriftLimit)
	if err != nil {
		return nil, err
	}
	if stack != "" {
		if err := checkStack("stack", stack); err != nil {
			return nil, err
		}
	}
	if repo, err = caller.ReadRepo(repo); err != nil {
		return nil, err
	}
	if stack != "" && repo == "" {
		return nil, invalid("stack %q needs repo: a stack is named with its repository (owner/name)", stack)
	}
	var out []api.DriftCheck
	err = s.Store.Read(ctx, func(tx store.Tx) (err error) {
		if stack != "" {
			out, err = tx.DriftHistory(repo, env, stack, n)
		} else {
			out, err = tx.LatestDrift(repo, env)
		}
		return
	})
	return out, err
}
