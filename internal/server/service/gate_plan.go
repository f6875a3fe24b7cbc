package service

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Plan freshness and the stack set: which plan a gate is decided over (the PR's latest, applicable)
// and whether an apply names exactly its changed stacks with their hashes.

// decision is what a satisfied gate decided over.
type decision struct {
	plan   *store.Execution
	stacks []string
	grants []int64
}

// applicable checks that a plan can be applied at all: finalized, succeeded, not cancelled,
// and every stack succeeded with a class. It returns the plan's stacks.
func applicable(tx store.Tx, plan *store.Execution) ([]store.Stack, error) {
	if err := applicablePlan(plan); err != nil {
		return nil, err
	}
	stacks, err := tx.Stacks(plan.ExecutionID)
	if err != nil {
		return nil, err
	}
	if err := applicableStacks(plan, stacks); err != nil {
		return nil, err
	}
	return stacks, nil
}

// planWhat names a plan in messages.
func planWhat(plan *store.Execution) string {
	return fmt.Sprintf("plan %s of %s", plan.ExecutionID, target(store.PRKey{Repo: plan.Repo, Environment: plan.Environment, PR: plan.PR}))
}

// applicablePlan checks that plan is finalized, succeeded and not cancelled.
func applicablePlan(plan *store.Execution) error {
	switch {
	case plan.Cancelled:
		return fmt.Errorf("%w: %s was cancelled", store.ErrPrecondition, planWhat(plan))
	case !plan.Finalized:
		return fmt.Errorf("%w: %s is not finalized", store.ErrPrecondition, planWhat(plan))
	case plan.Status != events.ExecutionSucceeded:
		return fmt.Errorf("%w: %s ended %s", store.ErrPrecondition, planWhat(plan), plan.Status)
	}
	return nil
}

// applicableStacks checks that every stack of plan succeeded with a class, and has a plan hash
// when it changes something.
func applicableStacks(plan *store.Execution, stacks []store.Stack) error {
	what := planWhat(plan)
	for _, st := range stacks {
		switch {
		case st.Status != events.StackSucceeded:
			return fmt.Errorf("%w: %s is not applicable: stack %q ended %s", store.ErrPrecondition, what, st.Stack, st.Status)
		case st.Class == "" || st.Class == events.ClassUnclassified:
			return fmt.Errorf("%w: %s is not applicable: stack %q is unclassified", store.ErrPrecondition, what, st.Stack)
		case changed(st.Class) && st.PlanHash == "":
			return fmt.Errorf("%w: %s recorded no plan hash for changed stack %q", store.ErrPrecondition, what, st.Stack)
		}
	}
	return nil
}

// decide applies the gate rules over the PR's latest plan (the latest the server received): the
// plan must be applicable (latestApplicablePlan), the request must name its changed stacks with
// their hashes (matchStackSet), no other PR may claim them (claimConflict), and an active grant
// must approve each gate they require (grantsFor).
func (s *Service) decide(tx store.Tx, key store.PRKey, in *api.GateCheck, now time.Time) (*decision, error) {
	plan, stacks, err := latestApplicablePlan(tx, key)
	if err != nil {
		return nil, err
	}
	names, err := matchStackSet(plan, stacks, in)
	if err != nil {
		return nil, err
	}
	if err := claimConflict(tx, key, names, now); err != nil {
		return nil, err
	}
	grantIDs, err := s.grantsFor(tx, plan, stacks, now)
	if err != nil {
		return nil, err
	}
	return &decision{plan: plan, stacks: names, grants: grantIDs}, nil
}

// LatestPlan returns the PR's latest plan in env, the one the server received last (what the
// gate decides over and an approval names), with its stacks; repo as ReadRepo selects it. A PR
// without a plan is ErrNotFound.
func (s *Service) LatestPlan(ctx context.Context, caller Caller, repo, env string, pr int) (*api.Execution, error) {
	if err := checkName("environment", env); err != nil {
		return nil, err
	}
	if pr <= 0 {
		return nil, invalid("pr must be a positive pull request number")
	}
	repo, err := caller.ReadRepo(repo)
	if err != nil {
		return nil, err
	}
	if repo == "" {
		return nil, invalid("repo is required (owner/name): a pull request is named with its repository")
	}
	var id string
	err = s.Store.Read(ctx, func(tx store.Tx) error {
		plan, err := tx.LatestPlan(store.PRKey{Repo: repo, Environment: env, PR: pr})
		if err == nil {
			id = plan.ExecutionID
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return s.Execution(ctx, caller, id)
}

// latestApplicablePlan returns the PR's latest plan, the one the server received last, with its
// stacks, when it can be applied (see applicable).
func latestApplicablePlan(tx store.Tx, key store.PRKey) (*store.Execution, []store.Stack, error) {
	plan, err := tx.LatestPlan(key)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil, fmt.Errorf("%w: %s has no plan", store.ErrPrecondition, target(key))
	}
	if err != nil {
		return nil, nil, err
	}
	stacks, err := applicable(tx, plan)
	if err != nil {
		return nil, nil, err
	}
	return plan, stacks, nil
}

// matchStackSet checks that the request names exactly the plan's changed stacks (a shard: some
// of them), each with the plan's hash and class, and returns the plan's changed stacks, sorted.
// The gate is decided over the plan, never over what the runner chose to list.
func matchStackSet(plan *store.Execution, stacks []store.Stack, in *api.GateCheck) ([]string, error) {
	planned := map[string]store.Stack{}
	for _, st := range stacks {
		if changed(st.Class) {
			planned[st.Stack] = st
		}
	}
	var missing, extra, differ, reclassified []string
	requested := map[string]bool{}
	for _, sp := range in.Stacks {
		requested[sp.Stack] = true
		st, ok := planned[sp.Stack]
		switch {
		case !ok:
			extra = append(extra, sp.Stack)
		case st.PlanHash != sp.PlanHash:
			differ = append(differ, sp.Stack)
		case st.Class != sp.Class:
			// The same content classified otherwise: the plan job under-reported (or the two
			// ran different tfstackplan versions). Gates follow from the plan's classes, so
			// they cannot be trusted: re-plan.
			reclassified = append(reclassified, fmt.Sprintf("%q (the plan reported it %s, the apply classifies it %s)", sp.Stack, st.Class, sp.Class))
		}
	}
	for name := range planned {
		// A fan-out's shard names its own stacks; the others are its sibling shards'.
		if !requested[name] && in.Shard == "" {
			missing = append(missing, name)
		}
	}
	var problems []string
	for _, p := range []struct {
		what  string
		names []string
	}{{"changed in the plan but not named", missing}, {"named but not changed in the plan", extra}, {"with a plan hash that differs from the plan's (stale plan)", differ}} {
		if len(p.names) > 0 {
			sort.Strings(p.names)
			problems = append(problems, fmt.Sprintf("stacks %s: %s", p.what, strings.Join(quoteAll(p.names), ", ")))
		}
	}
	if len(reclassified) > 0 {
		sort.Strings(reclassified)
		problems = append(problems, "stacks whose plan the apply classifies otherwise (re-plan): "+strings.Join(reclassified, ", "))
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: the apply does not match plan %s: %s", store.ErrDenied, plan.ExecutionID, strings.Join(problems, "; "))
	}
	names := make([]string, 0, len(planned))
	for name := range planned {
		names = append(names, name)
	}
	sort.Strings(names)
	return names, nil
}

func quoteAll(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = fmt.Sprintf("%q", n)
	}
	return out
}

// validShard reports whether s is a fan-out shard, "K/N" with 1 <= K <= N <= 999, each number
// written as the API's pattern has it: digits without a sign or a leading zero.
func validShard(s string) bool {
	ks, ns, ok := strings.Cut(s, "/")
	k, kerr := strconv.Atoi(ks)
	n, nerr := strconv.Atoi(ns)
	return ok && kerr == nil && nerr == nil && strconv.Itoa(k) == ks && strconv.Itoa(n) == ns && k >= 1 && k <= n && n <= 999
}
