package service

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

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
// may check (Policy.MayCheckGate), in a repository it may act in. The decision is made in
// steps, each a function of its own: the request (checkGateRequest), the caller's identity
// (gateIdentity), the plan (latestApplicablePlan), its stack set (matchStackSet), its gates
// (grantsFor), the other PRs' claims (claimConflict) and the lease (nextLease).
func (s *Service) GateCheck(ctx context.Context, caller Caller, in *api.GateCheck) (api.GateLease, error) {
	repo, err := checkGateRequest(caller, in)
	if err != nil {
		return api.GateLease{}, err
	}
	now := s.Now()
	key := store.PRKey{Repo: repo, Environment: in.Environment, PR: in.PR}
	where := target(key)
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
		refuse := func(err error) error {
			decision = err
			return audit(tx, now, caller, repo, "gate.check", where, "", "denied", fmt.Sprintf("execution %s, sha %s: %v", in.ExecutionID, in.SHA, err))
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
		member, refusal, err := s.gateIdentity(tx, caller, repo, in, prev)
		if err != nil {
			return err
		}
		if refusal != nil {
			// A refused caller changes nothing: deny would revoke the lease, which is not its.
			return refuse(refusal)
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
		if prev != nil && !prev.RevokedAt.IsZero() {
			return deny(fmt.Errorf("%w: the lease of execution %s was already revoked (%s)", store.ErrDenied, in.ExecutionID, prev.Outcome))
		}
		if prev != nil && !prev.ExpiresAt.After(now) {
			return deny(fmt.Errorf("%w: the lease of execution %s ended at %s, lease_ttl after its first grant: a re-check does not extend it",
				store.ErrDenied, in.ExecutionID, prev.ExpiresAt.UTC().Format(time.RFC3339)))
		}
		if s.Policy.Environments[in.Environment].Requester == "" {
			return deny(fmt.Errorf("%w: the policy names no requester for environment %q", store.ErrPrecondition, in.Environment))
		}
		d, err := s.decide(tx, key, in, now)
		if err != nil {
			if errors.Is(err, store.ErrUnavailable) {
				return err
			}
			return deny(err)
		}
		lease = s.nextLease(prev, key, in, caller.Name, member, d, now)
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

// checkGateRequest validates a gate check's fields and returns the repository it acts in.
func checkGateRequest(caller Caller, in *api.GateCheck) (string, error) {
	if err := checkNames("execution_id", in.ExecutionID, "environment", in.Environment); err != nil {
		return "", err
	}
	repo, err := caller.writeRepo(in.Repo)
	if err != nil {
		return "", err
	}
	if in.PR <= 0 {
		return "", invalid("pr must be a positive pull request number")
	}
	if strings.TrimSpace(in.SHA) == "" {
		return "", invalid("sha is required: the commit being applied is recorded with the decision")
	}
	if err := checkShort("sha", in.SHA); err != nil {
		return "", err
	}
	if len(in.Stacks) == 0 {
		return "", invalid("stacks is required: name every stack the apply changes with its plan hash")
	}
	if in.Shard != "" && !validShard(in.Shard) {
		return "", invalid(fmt.Sprintf("shard %q is not K/N with 1 <= K <= N <= 999", in.Shard))
	}
	if err := checkStackNames(len(in.Stacks), func(i int) string { return in.Stacks[i].Stack }); err != nil {
		return "", err
	}
	for _, sp := range in.Stacks {
		if err := checkShort("plan_hash", sp.PlanHash); err != nil {
			return "", err
		}
		if !sp.Class.Valid() {
			return "", invalid(fmt.Sprintf("stack %q: class %q is not one of no-changes, additive, mutating, destructive, unclassified: the apply sends the class it gives each plan", sp.Stack, sp.Class))
		}
	}
	return repo, nil
}

// gateIdentity says why caller may not check the gate for execution in.ExecutionID at all (nil
// when it may go on to be decided), and returns the member the granter would bind for it: an
// execution announced by another principal or in another repository, a lease (prev) taken for
// another repository, environment, PR or principal, a GitHub job of another pull request than
// in.PR, a caller the environment's apply_from does not allow, or one whose claims cannot fill
// the member the granter binds, is not the caller's to check. Nothing before it has changed
// anything, and a refusal changes nothing: it may not end the lease of the job that holds it
// (another job of the same run shares its principal). The error is the store's.
func (s *Service) gateIdentity(tx store.Tx, caller Caller, repo string, in *api.GateCheck, prev *store.Lease) (member string, refusal, err error) {
	// An execution announced by another principal is not this caller's to apply: its lease
	// would block the owner's own check, and its claims are not the caller's.
	switch owner, erepo, err := tx.ExecutionPrincipal(in.ExecutionID); {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		return "", nil, err
	case owner != caller.Name || erepo != repo:
		return "", fmt.Errorf("%w: execution %s was announced by another principal or in another repository", store.ErrDenied, in.ExecutionID), nil
	}
	if prev != nil {
		switch {
		case prev.Repo != repo:
			// Denied without naming what the other repository's lease is for.
			return "", fmt.Errorf("%w: execution %s already holds a lease of another repository; choose another execution id", store.ErrDenied, in.ExecutionID), nil
		case prev.Environment != in.Environment || prev.PR != in.PR:
			return "", fmt.Errorf("%w: execution %s already holds a lease for %s, not %s", store.ErrDenied, in.ExecutionID,
				target(leaseKey(*prev)), target(store.PRKey{Repo: repo, Environment: in.Environment, PR: in.PR})), nil
		case prev.Principal != "" && prev.Principal != caller.Name:
			return "", fmt.Errorf("%w: execution %s holds a lease granted to another principal", store.ErrDenied, in.ExecutionID), nil
		}
	}
	ep := s.Policy.Environments[in.Environment]
	if why := ep.MayCheckGate(in.Environment, repo, caller); why != "" {
		return "", fmt.Errorf("%w: %s", store.ErrDenied, why), nil
	}
	if why := prConfined(caller, in.PR); why != "" {
		return "", fmt.Errorf("%w: %s", store.ErrDenied, why), nil
	}
	// The member is what the granter binds; without one it is only recorded, so a caller
	// whose claims cannot fill it is refused only where it would be bound.
	member, err = ep.MemberFor(caller)
	if err != nil && s.granter().Name() != granter.KindNone {
		return "", fmt.Errorf("%w: %v", store.ErrDenied, err), nil
	}
	return member, nil, nil
}

// nextLease is the lease a satisfied check gives principal for in: a re-check (prev) keeps its
// first grant's time, its end and what the sweeper needs to know of its binding. A lease ends at
// most lease_ttl after its first grant: a job that keeps re-checking does not keep the
// requester leased.
func (s *Service) nextLease(prev *store.Lease, key store.PRKey, in *api.GateCheck, principal, member string, d *decision, now time.Time) store.Lease {
	lease := store.Lease{Repo: key.Repo, ExecutionID: in.ExecutionID, Environment: in.Environment, PR: in.PR,
		Requester: s.Policy.Environments[in.Environment].Requester,
		GrantedAt: now, ExpiresAt: now.Add(s.ttl(in.Environment, true)), Principal: principal, SHA: in.SHA,
		PlanID: d.plan.ExecutionID, GrantIDs: d.grants, Member: member,
		// Marked bound before the granter is asked, so a crash in between still leaves the
		// sweeper something to remove.
		Bound: s.granter().Name() != granter.KindNone}
	if prev != nil {
		lease.GrantedAt, lease.ExpiresAt = prev.GrantedAt, prev.ExpiresAt
		lease.UnbindAttempts, lease.UnbindError = prev.UnbindAttempts, prev.UnbindError
		lease.Bound = lease.Bound || prev.Bound
	}
	return lease
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
		if why := prConfined(caller, l.PR); why != "" {
			return fmt.Sprintf("the lease of execution %s is another pull request's: %s", l.ExecutionID, why)
		}
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
