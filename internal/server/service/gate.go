package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/granter"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// The apply gate: approvals (grants) bound to a plan's content, the fail-closed check that
// leases the requester, and the revoke that ends exactly what the lease took.

func (s *Service) granter() granter.Granter {
	if s.Granter == nil {
		return granter.None{}
	}
	return s.Granter
}

func target(k store.PRKey) string { return fmt.Sprintf("%s %s PR #%d", k.Repo, k.Environment, k.PR) }

// GateCheck decides, fail-closed, whether an apply may proceed, and leases the requester when
// it may. Every check decides afresh and is audited; a satisfied check binds the lease through
// the granter, and a granter failure denies. Only a caller the environment's apply_from allows
// may check (Policy.MayCheckGate), in a repository it may act in.
func (s *Service) GateCheck(ctx context.Context, caller Caller, in *api.GateCheck) (api.GateLease, error) {
	if err := checkNames("execution_id", in.ExecutionID, "environment", in.Environment); err != nil {
		return api.GateLease{}, err
	}
	repo, err := caller.writeRepo(in.Repo)
	if err != nil {
		return api.GateLease{}, err
	}
	if in.PR <= 0 {
		return api.GateLease{}, invalid("pr must be a positive pull request number")
	}
	if strings.TrimSpace(in.SHA) == "" {
		return api.GateLease{}, invalid("sha is required: the commit being applied is recorded with the decision")
	}
	if err := checkText("sha", in.SHA, MaxShortLen); err != nil {
		return api.GateLease{}, err
	}
	if len(in.Stacks) == 0 {
		return api.GateLease{}, invalid("stacks is required: name every stack the apply changes with its plan hash")
	}
	if in.Shard != "" && !validShard(in.Shard) {
		return api.GateLease{}, invalid(fmt.Sprintf("shard %q is not K/N with 1 <= K <= N <= 999", in.Shard))
	}
	if err := checkStackNames(len(in.Stacks), func(i int) string { return in.Stacks[i].Stack }); err != nil {
		return api.GateLease{}, err
	}
	for _, sp := range in.Stacks {
		if err := checkText("plan_hash", sp.PlanHash, MaxShortLen); err != nil {
			return api.GateLease{}, err
		}
		if !sp.Class.Valid() {
			return api.GateLease{}, invalid(fmt.Sprintf("stack %q: class %q is not one of no-changes, additive, mutating, destructive, unclassified: the apply sends the class it gives each plan", sp.Stack, sp.Class))
		}
	}
	now := s.Now()
	key := store.PRKey{Repo: repo, Environment: in.Environment, PR: in.PR}
	where := target(key)
	principal := caller.Name
	var lease store.Lease
	var decision error
	err = s.Store.Write(ctx, func(tx store.Tx) error {
		decision = nil
		if err := tx.LockEnvironment(repo, in.Environment); err != nil {
			return err
		}
		prev, err := tx.Lease(in.ExecutionID)
		switch {
		case errors.Is(err, store.ErrNotFound):
			prev = nil
		case err != nil:
			return err
		}
		deny := func(err error) error {
			decision = err
			if prev != nil && prev.RevokedAt.IsZero() && prev.Repo == repo && prev.Environment == in.Environment && prev.PR == in.PR {
				// The lease an earlier check gave no longer holds: end it now (the sweeper
				// removes its binding) rather than let it run to its expiry.
				prev.RevokedAt, prev.Outcome = now, "denied on re-check"
				if err := tx.PutLease(*prev); err != nil {
					return err
				}
			}
			return audit(tx, now, caller, repo, "gate.check", where, "", "denied", fmt.Sprintf("execution %s, sha %s: %v", in.ExecutionID, in.SHA, err))
		}
		// An execution announced by another principal is not this caller's to apply: its lease
		// would block the owner's own check, and its claims are not the caller's.
		switch owner, erepo, err := tx.ExecutionPrincipal(in.ExecutionID); {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return err
		case owner != principal || erepo != repo:
			// Denied without touching the owner's lease (deny would revoke it).
			decision = fmt.Errorf("%w: execution %s was announced by another principal or in another repository", store.ErrDenied, in.ExecutionID)
			return audit(tx, now, caller, repo, "gate.check", where, "", "denied", decision.Error())
		}
		// The apply execution itself may have been cancelled (unknown yet is fine: the runner
		// checks the gate before it announces the apply).
		cancelled, _, err := tx.ExecutionCancel(in.ExecutionID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if cancelled {
			return deny(fmt.Errorf("%w: execution %s was cancelled", store.ErrDenied, in.ExecutionID))
		}
		if prev != nil {
			switch {
			case prev.Repo != repo:
				// Denied without naming what the other repository's lease is for.
				decision = fmt.Errorf("%w: execution %s already holds a lease of another repository; choose another execution id", store.ErrDenied, in.ExecutionID)
				return audit(tx, now, caller, repo, "gate.check", where, "", "denied", decision.Error())
			case prev.Environment != in.Environment || prev.PR != in.PR:
				decision = fmt.Errorf("%w: execution %s already holds a lease for %s, not %s", store.ErrDenied, in.ExecutionID,
					target(store.PRKey{Repo: prev.Repo, Environment: prev.Environment, PR: prev.PR}), where)
				return audit(tx, now, caller, repo, "gate.check", where, "", "denied", decision.Error())
			case prev.Principal != "" && prev.Principal != principal:
				decision = fmt.Errorf("%w: execution %s holds a lease granted to another principal", store.ErrDenied, in.ExecutionID)
				return audit(tx, now, caller, repo, "gate.check", where, "", "denied", decision.Error())
			case !prev.RevokedAt.IsZero():
				return deny(fmt.Errorf("%w: the lease of execution %s was already revoked (%s)", store.ErrDenied, in.ExecutionID, prev.Outcome))
			}
		}
		ep := s.Policy.Environments[in.Environment]
		if why := ep.MayCheckGate(in.Environment, repo, caller); why != "" {
			return deny(fmt.Errorf("%w: %s", store.ErrDenied, why))
		}
		if ep.Requester == "" {
			return deny(fmt.Errorf("%w: the policy names no requester for environment %q", store.ErrPrecondition, in.Environment))
		}
		// The member is what the granter binds; without one it is only recorded, so a caller
		// whose claims cannot fill it is refused only where it would be bound.
		member, err := ep.MemberFor(caller)
		if err != nil && s.granter().Name() != granter.KindNone {
			return deny(fmt.Errorf("%w: %v", store.ErrDenied, err))
		}
		d, err := s.decide(tx, key, in, now)
		if err != nil {
			if errors.Is(err, store.ErrUnavailable) {
				return err
			}
			return deny(err)
		}
		lease = store.Lease{Repo: repo, ExecutionID: in.ExecutionID, Environment: in.Environment, PR: in.PR, Requester: ep.Requester,
			GrantedAt: now, ExpiresAt: now.Add(s.ttl(in.Environment, true)), Principal: principal, SHA: in.SHA,
			PlanID: d.plan.ExecutionID, GrantIDs: d.grants, Member: member,
			// Marked bound before the granter is asked, so a crash in between still leaves the
			// sweeper something to remove.
			Bound: s.granter().Name() != granter.KindNone}
		if prev != nil {
			lease.GrantedAt, lease.UnbindAttempts, lease.UnbindError = prev.GrantedAt, prev.UnbindAttempts, prev.UnbindError
			lease.Bound = lease.Bound || prev.Bound
		}
		if err := tx.PutLease(lease); err != nil {
			return err
		}
		detail := fmt.Sprintf("execution %s, sha %s; plan %s at sha %s; stacks %s; grants %v; requester %s",
			in.ExecutionID, in.SHA, d.plan.ExecutionID, d.plan.SHA, strings.Join(d.stacks, ", "), d.grants, lease.Requester)
		if in.Shard != "" {
			detail = "shard " + in.Shard + " naming " + strconv.Itoa(len(in.Stacks)) + " stacks, " + detail
		}
		if prev != nil {
			detail = "re-check, " + detail
		}
		return audit(tx, now, caller, repo, "gate.check", where, "", "allowed", detail)
	})
	if err != nil {
		return api.GateLease{}, err
	}
	if decision != nil {
		return api.GateLease{}, decision
	}
	if err := s.bind(ctx, caller, lease); err != nil {
		return api.GateLease{}, err
	}
	return api.GateLease{Requester: lease.Requester, ExpiresAt: lease.ExpiresAt}, nil
}

// bind asks the granter to make a lease real; a failure revokes the lease and denies.
func (s *Service) bind(ctx context.Context, caller Caller, l store.Lease) error {
	g := s.granter()
	if g.Name() == granter.KindNone {
		return nil
	}
	gctx, cancel := context.WithTimeout(ctx, GranterBudget)
	gerr := g.Grant(gctx, binding(l))
	cancel()
	if gerr == nil {
		return nil
	}
	now := s.Now()
	ctx = context.WithoutCancel(ctx)
	err := s.Store.Write(ctx, func(tx store.Tx) error {
		cur, err := tx.Lease(l.ExecutionID)
		if err != nil {
			return err
		}
		if cur.RevokedAt.IsZero() {
			cur.RevokedAt, cur.Outcome = now, "grant failed"
		}
		cur.Bound = true // whatever part of the grant took effect is removed by the sweeper
		if err := tx.PutLease(*cur); err != nil {
			return err
		}
		return audit(tx, now, caller, l.Repo, "gate.check", target(leaseKey(l)), "", "denied",
			fmt.Sprintf("execution %s: the %s granter failed: %v", l.ExecutionID, g.Name(), gerr))
	})
	if err != nil {
		// The store's error stays out of the answer (it may carry database text); the lease is
		// still marked bound, so the sweeper removes whatever part of the grant took effect.
		return fmt.Errorf("%w: the %s granter failed (%v), and recording the refusal failed too", store.ErrDenied, g.Name(), gerr)
	}
	s.unbind(ctx, caller, l) // whatever took effect goes now; the sweeper retries a failure
	return fmt.Errorf("%w: the %s granter could not grant %s to the runner: %v", store.ErrDenied, g.Name(), l.Requester, gerr)
}

// GranterBudget bounds one call to the granter.
const GranterBudget = 30 * time.Second

func leaseKey(l store.Lease) store.PRKey {
	return store.PRKey{Repo: l.Repo, Environment: l.Environment, PR: l.PR}
}

func binding(l store.Lease) granter.Binding {
	return granter.Binding{LeaseID: l.ExecutionID, Environment: l.Environment, Requester: l.Requester, Member: l.Member, ExpiresAt: l.ExpiresAt}
}

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

// decide applies the gate rules over the PR's latest plan (the latest the server received).
func (s *Service) decide(tx store.Tx, key store.PRKey, in *api.GateCheck, now time.Time) (*decision, error) {
	plan, err := tx.LatestPlan(key)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s has no plan", store.ErrPrecondition, target(key))
	}
	if err != nil {
		return nil, err
	}
	stacks, err := applicable(tx, plan)
	if err != nil {
		return nil, err
	}
	// The request must name exactly the plan's changed stacks, each with the plan's hash: the
	// gate is decided over the plan, never over what the runner chose to list.
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
	conflicts, err := conflictsOf(tx, key, names, now)
	if err != nil {
		return nil, err
	}
	if len(conflicts) > 0 {
		c := conflicts[0]
		return nil, fmt.Errorf("%w: stack %q is claimed by PR #%d (execution %s) in %q", store.ErrDenied, c.Stacks[0], c.PR, c.ExecutionID, in.Environment)
	}
	var grantIDs []int64
	var unmet []string
	required, whys, err := s.requiredGates(tx, plan, stacks, now)
	if err != nil {
		return nil, err
	}
	for i, g := range required {
		if !g.Satisfied {
			unmet = append(unmet, fmt.Sprintf("%s on %s (stacks %s)%s", g.Class, g.Target, strings.Join(g.Stacks, ", "), whys[i]))
			continue
		}
		grantIDs = append(grantIDs, g.GrantID)
	}
	if len(unmet) > 0 {
		return nil, fmt.Errorf("%w: no active grant approved this plan's content for gate %s", store.ErrDenied, strings.Join(unmet, "; "))
	}
	return &decision{plan: plan, stacks: names, grants: grantIDs}, nil
}

// gateKey is what a grant and the gate it approves share.
type gateKey struct {
	pr            store.PRKey
	class, target string
}

func keyOf(g api.Gate) gateKey {
	return gateKey{store.PRKey{Repo: g.Repo, Environment: g.Environment, PR: g.PR}, g.Class, g.Target}
}

// activeGrants reads the grants active at now of k's repository, environment and PR (zero
// values select everything) in one query, newest first within each gate's key.
func activeGrants(tx store.Tx, k store.PRKey, now time.Time) (map[gateKey][]api.Grant, error) {
	grants, err := tx.Grants(store.GrantFilter{Repo: k.Repo, Environment: k.Environment, PR: k.PR, ActiveAt: now})
	if err != nil {
		return nil, err
	}
	out := map[gateKey][]api.Grant{}
	for _, gr := range grants {
		k := gateKey{store.PRKey{Repo: gr.Repo, Environment: gr.Environment, PR: gr.PR}, gr.Class, gr.Target}
		out[k] = append(out[k], gr)
	}
	return out, nil
}

// approve marks gate g satisfied by the newest of its active grants (newest first) that
// approved exactly the content hashOf gives on g's stacks, naming that grant, who made it and
// when; when none did, it returns why (for a message: "" when g has no active grant).
func approve(g *api.Gate, grants []api.Grant, hashOf func(stack string) string) string {
	why := ""
	for _, gr := range grants {
		if stack, ok := covers(gr, g.Stacks, hashOf); !ok {
			why = fmt.Sprintf(": grant %d approved plan %s, whose content differs on stack %q", gr.ID, gr.ExecutionID, stack)
			continue
		}
		g.Satisfied, g.GrantID, g.GrantedBy, g.GrantedAt = true, gr.ID, gr.Principal, gr.GrantedAt
		return ""
	}
	return why
}

// requiredGates returns the gates plan (with its stacks) requires now under the policy, each
// satisfied, with its grant, when an active grant approved the plan's content on its stacks;
// whys says, for each gate not satisfied, why (see approve). GateCheck decides over it, and
// ExecutionGates reports it.
func (s *Service) requiredGates(tx store.Tx, plan *store.Execution, stacks []store.Stack, now time.Time) (gates []api.Gate, whys []string, err error) {
	gates = s.gatesOf(plan, stacks)
	if len(gates) == 0 {
		return gates, nil, nil
	}
	active, err := activeGrants(tx, store.PRKey{Repo: plan.Repo, Environment: plan.Environment, PR: plan.PR}, now)
	if err != nil {
		return nil, nil, err
	}
	hashes := make(map[string]string, len(stacks))
	for _, st := range stacks {
		hashes[st.Stack] = st.PlanHash
	}
	whys = make([]string, len(gates))
	for i := range gates {
		whys[i] = approve(&gates[i], active[keyOf(gates[i])], func(n string) string { return hashes[n] })
	}
	return gates, whys, nil
}

// conflictsOf returns, by PR, the claims of PRs other than k's on the named stacks of k's
// repository and environment, active at now.
func conflictsOf(tx store.Tx, k store.PRKey, stacks []string, now time.Time) ([]api.ClaimConflict, error) {
	if len(stacks) == 0 {
		return []api.ClaimConflict{}, nil
	}
	claims, err := tx.ClaimsOn(store.PRKey{Repo: k.Repo, Environment: k.Environment}, stacks, now)
	if err != nil {
		return nil, err
	}
	out := []api.ClaimConflict{}
	at := map[int]int{}
	for _, c := range claims {
		if c.PR == k.PR {
			continue
		}
		i, ok := at[c.PR]
		if !ok {
			i = len(out)
			at[c.PR] = i
			out = append(out, api.ClaimConflict{PR: c.PR, ExecutionID: c.ExecutionID})
		}
		out[i].Stacks = append(out[i].Stacks, c.Stack)
	}
	slices.SortFunc(out, func(a, b api.ClaimConflict) int { return a.PR - b.PR })
	for i := range out {
		sort.Strings(out[i].Stacks)
	}
	return out, nil
}

// ExecutionGates says what plan execution id needs before its apply: the gates it requires now
// under the environment's policy, each satisfied or not (with the grant that satisfies it), and
// the other PRs' claims on the stacks it changes. It is read like the execution: one of a
// repository the caller may not read is not found.
func (s *Service) ExecutionGates(ctx context.Context, caller Caller, id string) (*api.ExecutionGates, error) {
	if err := checkName("execution_id", id); err != nil {
		return nil, err
	}
	var out *api.ExecutionGates
	now := s.Now()
	err := s.Store.Read(ctx, func(tx store.Tx) error {
		e, err := readExecution(tx, caller, id)
		if err != nil {
			return err
		}
		if e.Op != api.ExecutionOp(events.OpPlan) {
			return fmt.Errorf("%w: execution %s is an %s, not a plan: only a plan requires gates", store.ErrPrecondition, id, e.Op)
		}
		stacks, err := tx.Stacks(id)
		if err != nil {
			return err
		}
		_, hasPolicy := s.Policy.Environments[e.Environment]
		x := &api.ExecutionGates{ExecutionID: id, Repo: e.Repo, Environment: e.Environment, PR: e.PR, Policy: hasPolicy}
		if _, err := applicable(tx, e); err != nil {
			x.Blocked = strings.TrimPrefix(err.Error(), store.ErrPrecondition.Error()+": ")
		}
		if x.Gates, _, err = s.requiredGates(tx, e, stacks, now); err != nil {
			return err
		}
		var names []string
		for _, st := range stacks {
			if changed(st.Class) {
				names = append(names, st.Stack)
			}
		}
		if x.Conflicts, err = conflictsOf(tx, store.PRKey{Repo: e.Repo, Environment: e.Environment, PR: e.PR}, names, now); err != nil {
			return err
		}
		out = x
		return nil
	})
	return out, err
}

// covers reports whether a grant approved every one of stacks at the hash hashOf gives; when
// not, it returns the first stack it does not cover.
func covers(g api.Grant, stacks []string, hashOf func(string) string) (string, bool) {
	approved := make(map[string]string, len(g.Stacks))
	for _, sp := range g.Stacks {
		approved[sp.Stack] = sp.PlanHash
	}
	for _, name := range stacks {
		if h, ok := approved[name]; !ok || h == "" || h != hashOf(name) {
			return name, false
		}
	}
	return "", true
}

func quoteAll(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = fmt.Sprintf("%q", n)
	}
	return out
}

// GateRevoke ends the lease of an apply execution: the lease, the grants its decision used
// and, when the apply succeeded, the PR's claims. Only the principal (and job, mayEnd) the lease
// was granted to, or an admin of its repository, may revoke it; an execution without a lease,
// or with one of a repository the caller may not act in, changes nothing, whatever
// environment and PR the request names. The granter's binding is removed after the commit;
// a failure is audited and left to the sweeper.
func (s *Service) GateRevoke(ctx context.Context, caller Caller, in *api.GateRevoke) (api.Ack, error) {
	if err := checkName("execution_id", in.ExecutionID); err != nil {
		return api.Ack{}, err
	}
	outcome := clip(in.Outcome, 64)
	now := s.Now()
	var revoked *store.Lease
	err := s.Store.Write(ctx, func(tx store.Tx) error {
		revoked = nil
		l, err := tx.Lease(in.ExecutionID)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if !caller.allows(l.Repo) {
			// Another repository's lease is none of the caller's, not even to learn of.
			return nil
		}
		if why := s.mayEnd(caller, l); why != "" {
			return fmt.Errorf("%w: %s; ending it is an admin action", store.ErrDenied, why)
		}
		if !l.RevokedAt.IsZero() {
			return nil
		}
		if err := tx.LockEnvironment(l.Repo, l.Environment); err != nil {
			return err
		}
		l.RevokedAt, l.Outcome = now, outcome
		if err := tx.PutLease(*l); err != nil {
			return err
		}
		released := int64(0)
		if outcome == "succeeded" {
			if released, err = tx.ReleaseClaims(leaseKey(*l), ""); err != nil {
				return err
			}
		}
		// The apply the grants approved is over: a later apply needs a fresh approval.
		ended, err := tx.ReleaseGrantIDs(l.GrantIDs, caller.Name, now)
		if err != nil {
			return err
		}
		revoked = l
		return audit(tx, now, caller, l.Repo, "gate.revoke", target(leaseKey(*l)), "", outcome,
			fmt.Sprintf("execution %s, %d grants ended, %d claims released", in.ExecutionID, ended, released))
	})
	if err != nil || revoked == nil || !revoked.Bound {
		return api.Ack{}, err
	}
	s.unbind(context.WithoutCancel(ctx), caller, *revoked)
	return api.Ack{}, nil
}

// mayEnd says why caller, which may act in l's repository, may not end lease l ("" when it
// may): an admin may; anyone else only when the lease was granted to it by name and, for a
// GitHub Actions job, when it is a job that may check the gate of the lease's environment. The
// jobs of one run share a principal, so the name alone would let a job of that run that never
// passed apply_from (a plan job, a job outside the GitHub environment) end the apply job's lease.
// A lease without a recorded principal is an admin's alone.
func (s *Service) mayEnd(caller Caller, l *store.Lease) string {
	switch {
	case caller.Admin:
		return ""
	case l.Principal == "":
		return fmt.Sprintf("the lease of execution %s records no principal", l.ExecutionID)
	case l.Principal != caller.Name:
		return fmt.Sprintf("the lease of execution %s was granted to another principal", l.ExecutionID)
	case caller.GitHub != nil:
		if why := s.Policy.Environments[l.Environment].MayCheckGate(l.Environment, l.Repo, caller); why != "" {
			return fmt.Sprintf("the lease of execution %s was granted to another job of the run: %s", l.ExecutionID, why)
		}
	}
	return ""
}

// unbind removes a revoked or expired lease's granter binding and records the outcome: done,
// or one more failed attempt (audited) for the sweeper to retry.
func (s *Service) unbind(ctx context.Context, caller Caller, l store.Lease) {
	gctx, cancel := context.WithTimeout(ctx, GranterBudget)
	gerr := s.granter().Revoke(gctx, binding(l))
	cancel()
	now := s.Now()
	_ = s.Store.Write(ctx, func(tx store.Tx) error {
		cur, err := tx.Lease(l.ExecutionID)
		if err != nil || !cur.Bound {
			return err
		}
		if gerr == nil {
			cur.Bound, cur.UnbindError = false, ""
			if err := tx.PutLease(*cur); err != nil {
				return err
			}
			return audit(tx, now, caller, cur.Repo, "gate.unbind", target(leaseKey(*cur)), "", "removed",
				fmt.Sprintf("execution %s: %s no longer granted to %s", cur.ExecutionID, cur.Requester, cur.Member))
		}
		cur.UnbindAttempts++
		cur.UnbindError = clip(gerr.Error(), MaxTextLen)
		if err := tx.PutLease(*cur); err != nil {
			return err
		}
		return audit(tx, now, caller, cur.Repo, "gate.unbind", target(leaseKey(*cur)), "", "failed",
			fmt.Sprintf("execution %s, attempt %d (retried by the sweeper): %v", cur.ExecutionID, cur.UnbindAttempts, gerr))
	})
}

// SweepLeases removes the granter bindings of leases revoked or expired at now (up to limit),
// and returns how many it tried. serve runs it periodically; a failure stays for the next sweep.
func (s *Service) SweepLeases(ctx context.Context, limit int) (int, error) {
	if s.granter().Name() == granter.KindNone {
		return 0, nil
	}
	var due []store.Lease
	now := s.Now()
	if err := s.Store.Read(ctx, func(tx store.Tx) (err error) { due, err = tx.LeasesToUnbind(now, limit); return }); err != nil {
		return 0, err
	}
	for _, l := range due {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		s.unbind(ctx, Caller{Name: "sweeper"}, l)
	}
	return len(due), nil
}

// sweepAccounts asks a granter that can to remove, from each requester of the policy, the
// expired bindings the store no longer knows of (a lost database, a crash between grant and
// record). They grant nothing once expired, so this is tidying, done rarely.
func (s *Service) sweepAccounts(ctx context.Context) {
	sw, ok := s.granter().(granter.Sweeper)
	if !ok {
		return
	}
	now := s.Now()
	seen := map[string]bool{}
	for _, ep := range s.Policy.Environments {
		if ep.Requester == "" || seen[ep.Requester] {
			continue
		}
		seen[ep.Requester] = true
		gctx, cancel := context.WithTimeout(ctx, GranterBudget)
		_, _ = sw.RemoveExpired(gctx, ep.Requester, now)
		cancel()
	}
}

// AccountSweepInterval is how often RunSweeper tidies the requesters' expired bindings.
const AccountSweepInterval = time.Hour

// RunSweeper sweeps leases every interval, and the requester accounts every
// AccountSweepInterval, until ctx ends.
func (s *Service) RunSweeper(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var lastAccounts time.Time
	for {
		_, _ = s.SweepLeases(ctx, 100)
		if time.Since(lastAccounts) >= AccountSweepInterval {
			s.sweepAccounts(ctx)
			lastAccounts = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Claims lists current claims of one repository (repo, or the caller's one) or, for a caller
// limited to none, of every repository (env empty: every environment).
func (s *Service) Claims(ctx context.Context, caller Caller, repo, env string) ([]api.Claim, error) {
	repo, err := caller.ReadRepo(repo)
	if err != nil {
		return nil, err
	}
	var out []api.Claim
	err = s.Store.Read(ctx, func(tx store.Tx) (err error) { out, err = tx.Claims(repo, env, s.Now()); return })
	return out, err
}

// ReleaseClaims releases one stack's claim, or all of a PR's claims in an environment. A
// non-admin caller must name a plan execution it announced itself and releases only the
// claims that execution took; anything else is an admin action.
func (s *Service) ReleaseClaims(ctx context.Context, caller Caller, in *api.ClaimsRelease) (api.Ack, error) {
	if err := checkName("environment", in.Environment); err != nil {
		return api.Ack{}, err
	}
	if in.PR <= 0 {
		return api.Ack{}, invalid("pr must be a positive pull request number")
	}
	if in.Stack != "" {
		if err := checkStack("stack", in.Stack); err != nil {
			return api.Ack{}, err
		}
	}
	if in.ExecutionID != "" {
		if err := checkName("execution_id", in.ExecutionID); err != nil {
			return api.Ack{}, err
		}
	}
	if err := checkText("reason", in.Reason, MaxTextLen); err != nil {
		return api.Ack{}, err
	}
	if caller.Admin && in.ExecutionID == "" && strings.TrimSpace(in.Reason) == "" {
		return api.Ack{}, invalid("reason is required to release a PR's claims")
	}
	if !caller.Admin && in.ExecutionID == "" {
		return api.Ack{}, fmt.Errorf("%w: a runner releases only the claims of its own execution (name it in execution_id); releasing a PR's claims is an admin action", store.ErrDenied)
	}
	repo, err := caller.writeRepo(in.Repo)
	if err != nil {
		return api.Ack{}, err
	}
	key := store.PRKey{Repo: repo, Environment: in.Environment, PR: in.PR}
	now := s.Now()
	return api.Ack{}, s.Store.Write(ctx, func(tx store.Tx) error {
		if in.ExecutionID != "" {
			owner, erepo, err := tx.ExecutionPrincipal(in.ExecutionID)
			if err != nil {
				return err
			}
			if erepo != repo {
				// Answered as for an unknown execution: the answer must not tell a caller of
				// one repository which ids another repository's executions have.
				return fmt.Errorf("%w: execution %q", store.ErrNotFound, in.ExecutionID)
			}
			if !caller.Admin && (owner == "" || owner != caller.Name) {
				return fmt.Errorf("%w: execution %s was not announced by %s; releasing its claims is an admin action", store.ErrDenied, in.ExecutionID, caller.Name)
			}
		}
		if err := tx.LockEnvironment(repo, in.Environment); err != nil {
			return err
		}
		var n int64
		var err error
		if in.ExecutionID != "" {
			n, err = tx.ReleaseExecutionClaims(in.Environment, in.ExecutionID, in.Stack)
		} else {
			n, err = tx.ReleaseClaims(key, in.Stack)
		}
		if err != nil || n == 0 {
			return err
		}
		what := "all stacks"
		if in.Stack != "" {
			what = "stack " + in.Stack
		}
		if in.ExecutionID != "" {
			what += " of execution " + in.ExecutionID
		}
		return audit(tx, now, caller, repo, "claims.release", target(key), in.Reason, "released", fmt.Sprintf("%s (%d claims)", what, n))
	})
}

func checkGrantKey(env string, pr int, class, target, reason string) error {
	if err := checkName("environment", env); err != nil {
		return err
	}
	if pr <= 0 {
		return invalid("pr must be a positive pull request number")
	}
	if !api.Class(class).Valid() {
		return invalid("class %q is not a change class", class)
	}
	if err := checkName("target", target); err != nil {
		return err
	}
	if err := checkGlob(target); err != nil {
		return invalid("target: %v", err)
	}
	if strings.TrimSpace(reason) == "" {
		return invalid("reason is required")
	}
	return checkText("reason", reason, MaxTextLen)
}

// MaxTime is the latest time the server stores (the year 2200): past it, a store's nanoseconds
// would not hold the time.
var MaxTime = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)

// gatesOf returns the gates plan requires under the policy: one per gate rule's class and glob
// that matches a stack the plan changes, each with its stacks.
func (s *Service) gatesOf(plan *store.Execution, stacks []store.Stack) []api.Gate {
	classes := map[string]events.Class{}
	for _, st := range stacks {
		if changed(st.Class) {
			classes[st.Stack] = st.Class
		}
	}
	gates := s.Policy.RequiredGates(plan.Environment, classes)
	for i := range gates {
		gates[i].Repo, gates[i].PR, gates[i].ExecutionID = plan.Repo, plan.PR, plan.ExecutionID
	}
	return gates
}

// describeGates lists gates for a message: "destructive on stacks/prod/** (stacks/prod/db)".
func describeGates(gates []api.Gate) string {
	if len(gates) == 0 {
		return "none"
	}
	out := make([]string, len(gates))
	for i, g := range gates {
		out[i] = fmt.Sprintf("%s on %s (%s)", g.Class, g.Target, strings.Join(g.Stacks, ", "))
	}
	return strings.Join(out, "; ")
}

// SatisfyGate approves the content of the plan the approver reviewed (in.ExecutionID) for one of
// the gates that plan requires: the gate's stacks with their content hashes. The plan must be
// the PR's latest (an older one is ErrStale, naming the latest: the approver has not seen what
// would be applied) and applicable, and the class and target one of its gates. The grant
// satisfies the gate only while the plan being applied has exactly that content on those
// stacks. An active grant approving the same content is not duplicated.
func (s *Service) SatisfyGate(ctx context.Context, caller Caller, in *api.GatesSatisfy) (api.Ack, error) {
	if err := checkGrantKey(in.Environment, in.PR, in.Class, in.Target, in.Reason); err != nil {
		return api.Ack{}, err
	}
	if in.ExecutionID == "" {
		return api.Ack{}, invalid("execution_id is required: name the plan you reviewed (the PR's latest plan)")
	}
	if err := checkName("execution_id", in.ExecutionID); err != nil {
		return api.Ack{}, err
	}
	repo, err := caller.writeRepo(in.Repo)
	if err != nil {
		return api.Ack{}, err
	}
	now := s.Now()
	if err := checkTime("expires_at", in.ExpiresAt); err != nil {
		return api.Ack{}, err
	}
	if !in.ExpiresAt.IsZero() && !in.ExpiresAt.After(now) {
		return api.Ack{}, invalid("expires_at %s is in the past", in.ExpiresAt.UTC().Format(time.RFC3339))
	}
	key := store.PRKey{Repo: repo, Environment: in.Environment, PR: in.PR}
	where := target(key)
	return api.Ack{}, s.Store.Write(ctx, func(tx store.Tx) error {
		if err := tx.LockEnvironment(repo, in.Environment); err != nil {
			return err
		}
		plan, err := tx.LatestPlan(key)
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: %s has no plan to approve", store.ErrPrecondition, where)
		}
		if err != nil {
			return err
		}
		if plan.ExecutionID != in.ExecutionID {
			return fmt.Errorf("%w: execution %s is not the latest plan of %s: plan %s (sha %s) arrived after it; review that plan and approve it",
				store.ErrStale, in.ExecutionID, where, plan.ExecutionID, plan.SHA)
		}
		stacks, err := applicable(tx, plan)
		if err != nil {
			return err
		}
		gates := s.gatesOf(plan, stacks)
		var gate *api.Gate
		for i := range gates {
			if gates[i].Class == in.Class && gates[i].Target == in.Target {
				gate = &gates[i]
			}
		}
		if gate == nil {
			return fmt.Errorf("%w: plan %s requires no gate %s on %q; the gates it requires: %s",
				store.ErrPrecondition, plan.ExecutionID, in.Class, in.Target, describeGates(gates))
		}
		hashes := map[string]string{}
		for _, st := range stacks {
			hashes[st.Stack] = st.PlanHash
		}
		approved := make([]api.StackPlan, len(gate.Stacks))
		for i, name := range gate.Stacks {
			approved[i] = api.StackPlan{Stack: name, PlanHash: hashes[name]}
		}
		active, err := tx.Grants(store.GrantFilter{Repo: repo, Environment: in.Environment, PR: in.PR, Class: in.Class, Target: in.Target, ActiveAt: now})
		if err != nil {
			return err
		}
		for _, g := range active {
			if _, ok := covers(g, gate.Stacks, func(n string) string { return hashes[n] }); ok && len(g.Stacks) == len(approved) {
				return nil
			}
		}
		if _, err := tx.AddGrant(api.Grant{Repo: repo, Environment: in.Environment, PR: in.PR, Class: in.Class, Target: in.Target,
			Principal: caller.Name, Reason: clip(in.Reason, MaxTextLen), GrantedAt: now, ExpiresAt: in.ExpiresAt.UTC(),
			ExecutionID: plan.ExecutionID, Stacks: approved}); err != nil {
			return err
		}
		if err := s.notifyApproved(tx, plan, gate, caller.Name, in.Reason, now); err != nil {
			return err
		}
		detail := fmt.Sprintf("plan %s at sha %s, stacks %s", plan.ExecutionID, plan.SHA, strings.Join(gate.Stacks, ", "))
		if !in.ExpiresAt.IsZero() {
			detail += "; expires " + in.ExpiresAt.UTC().Format(time.RFC3339)
		}
		return audit(tx, now, caller, repo, "gates.satisfy", fmt.Sprintf("%s %s on %s", where, in.Class, in.Target), in.Reason, "granted", detail)
	})
}

// ReleaseGrant ends the active grants with the key; releasing nothing is not an error.
func (s *Service) ReleaseGrant(ctx context.Context, caller Caller, in *api.GrantsRelease) (api.Ack, error) {
	if err := checkGrantKey(in.Environment, in.PR, in.Class, in.Target, in.Reason); err != nil {
		return api.Ack{}, err
	}
	repo, err := caller.writeRepo(in.Repo)
	if err != nil {
		return api.Ack{}, err
	}
	key := store.PRKey{Repo: repo, Environment: in.Environment, PR: in.PR}
	now := s.Now()
	return api.Ack{}, s.Store.Write(ctx, func(tx store.Tx) error {
		if err := tx.LockEnvironment(repo, in.Environment); err != nil {
			return err
		}
		n, err := tx.ReleaseGrants(key, in.Class, in.Target, caller.Name, now)
		if err != nil || n == 0 {
			return err
		}
		return audit(tx, now, caller, repo, "grants.release", fmt.Sprintf("%s %s on %s", target(key), in.Class, in.Target), in.Reason, "released", "")
	})
}

// Gates lists a page of the required gates, newest first (store.RowKey), with whether an
// active grant approved the content of the plan that required each; before is the Cursor of the
// previous page's last gate (empty: the newest page).
func (s *Service) Gates(ctx context.Context, caller Caller, p Page, before string) ([]api.Gate, error) {
	f, err := p.after(caller, before, 2)
	if err != nil {
		return nil, err
	}
	var out []api.Gate
	now := s.Now()
	err = s.Store.Read(ctx, func(tx store.Tx) error {
		gates, err := tx.Gates(f)
		if err != nil || len(gates) == 0 {
			return err
		}
		active, err := activeGrants(tx, store.PRKey{Repo: f.Repo, Environment: f.Environment, PR: f.PR}, now)
		if err != nil {
			return err
		}
		var plans []string
		for _, g := range gates {
			if len(active[keyOf(g)]) > 0 {
				plans = append(plans, g.ExecutionID)
			}
		}
		hashes, err := tx.PlanHashes(plans)
		if err != nil {
			return err
		}
		for _, g := range gates {
			h := hashes[g.ExecutionID]
			approve(&g, active[keyOf(g)], func(n string) string { return h[n] })
			g.Cursor = cursorOf(store.RowKey{At: g.RequiredAt, Repo: g.Repo, Environment: g.Environment, PR: g.PR, Names: []string{g.Class, g.Target}})
			out = append(out, g)
		}
		return nil
	})
	return out, err
}

// Grants lists a page of grants, newest (highest id) first; before > 0 lists those with a lower
// id (the page after grant before).
func (s *Service) Grants(ctx context.Context, caller Caller, p Page, before int64) ([]api.Grant, error) {
	p, err := p.scoped(caller)
	if err != nil {
		return nil, err
	}
	if before < 0 {
		return nil, invalid("before %d is negative (0: the newest grants)", before)
	}
	var out []api.Grant
	err = s.Store.Read(ctx, func(tx store.Tx) (err error) {
		out, err = tx.Grants(store.GrantFilter{Repo: p.Repo, Environment: p.Environment, PR: p.PR, Before: before, Limit: p.Limit})
		return
	})
	return out, err
}

// validShard reports whether s is a fan-out shard, "K/N" with 1 <= K <= N <= 999.
func validShard(s string) bool {
	ks, ns, ok := strings.Cut(s, "/")
	k, kerr := strconv.Atoi(ks)
	n, nerr := strconv.Atoi(ns)
	return ok && kerr == nil && nerr == nil && len(ks) <= 3 && len(ns) <= 3 && k >= 1 && k <= n && !strings.HasPrefix(ks, "+") && !strings.HasPrefix(ns, "+")
}
