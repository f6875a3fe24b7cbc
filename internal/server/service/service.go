// Package service holds the control plane's domain rules: executions and their stacks, logs,
// claims, gates and grants, checks, cancellation and the audit log. It sits between the HTTP
// handlers and the store; every rule that must hold across replicas runs inside one store
// transaction.
package service

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Limits on what the service stores.
const (
	MaxNameLen        = 1024      // execution ids, stack names, environments
	MaxLogChunk       = 1_500_000 // bytes of data in one log chunk (the contract's maxLength)
	MaxDestructive    = 200       // destructive addresses kept per stack
	MaxTextLen        = 16 << 10  // error messages, reasons
	DefaultLogReadMax = 1 << 20
)

// Service implements the domain rules over a store.
type Service struct {
	Store  store.Store
	Policy *Policy
	// Now is the clock (tests replace it).
	Now func() time.Time
	// Hub receives "execution changed" signals from every replica.
	Hub *Hub
}

// New returns a service over s with policy p (nil: nothing gated).
func New(s store.Store, p *Policy) *Service {
	if p == nil {
		p = &Policy{Environments: map[string]EnvPolicy{}}
	}
	return &Service{Store: s, Policy: p, Now: func() time.Time { return time.Now().UTC() }, Hub: NewHub()}
}

// Run relays store notifications (from this and every other replica) to the hub until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	return s.Store.Listen(ctx, s.Hub.Publish)
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{store.ErrInvalid}, a...)...)
}

// checkName validates an identifier-like field: non-empty, bounded, printable.
func checkName(field, v string) error {
	if v == "" {
		return invalid("%s is required", field)
	}
	if len(v) > MaxNameLen {
		return invalid("%s is longer than %d bytes", field, MaxNameLen)
	}
	if !utf8.ValidString(v) {
		return invalid("%s is not valid UTF-8", field)
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return invalid("%s %q contains a control character", field, v)
		}
	}
	return nil
}

// checkNames checks (field, value) pairs with checkName.
func checkNames(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if err := checkName(pairs[i], pairs[i+1]); err != nil {
			return err
		}
	}
	return nil
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

func (s *Service) ttl(env string, lease bool) time.Duration {
	if lease {
		if d := s.Policy.Environments[env].LeaseTTL; d > 0 {
			return d
		}
		return DefaultLeaseTTL
	}
	if s.Policy.ClaimTTL > 0 {
		return s.Policy.ClaimTTL
	}
	return DefaultClaimTTL
}

func ackOf(e *store.Execution) api.Ack { return cancelAck(e.Cancelled, e.CancelReason) }

func cancelAck(cancelled bool, reason string) api.Ack {
	if !cancelled {
		return api.Ack{}
	}
	if reason == "" {
		reason = "cancelled by an administrator"
	}
	return api.Ack{Cancel: true, Reason: reason}
}

func audit(tx store.Tx, at time.Time, principal, action, target, reason, outcome, detail string) error {
	_, err := tx.AddAudit(api.AuditEntry{At: at, Principal: principal, Action: action, Target: target,
		Reason: clip(reason, MaxTextLen), Outcome: outcome, Detail: clip(detail, MaxTextLen)})
	return err
}

// Init starts (or re-announces) an execution; the first stored copy wins.
func (s *Service) Init(ctx context.Context, in *api.Init) (api.Ack, error) {
	if err := checkNames("execution_id", in.ExecutionID, "environment", in.Environment); err != nil {
		return api.Ack{}, err
	}
	if !in.Op.Valid() {
		return api.Ack{}, invalid("op %q is not plan or apply", in.Op)
	}
	for _, st := range in.Stacks {
		if err := checkName("stack", st); err != nil {
			return api.Ack{}, err
		}
	}
	for _, e := range in.Edges {
		if err := checkNames("edge from", e.From, "edge to", e.To); err != nil {
			return api.Ack{}, err
		}
	}
	now := s.Now()
	e := &store.Execution{}
	e.ExecutionID, e.Repo, e.PR, e.SHA, e.Base = in.ExecutionID, in.Repo, in.PR, in.SHA, in.Base
	e.Environment, e.Op, e.Actor, e.RunURL = in.Environment, api.ExecutionOp(in.Op), in.Actor, in.RunURL
	e.Status, e.Edges, e.EdgesApproximate = events.ExecutionRunning, in.Edges, in.EdgesApproximate
	e.StartedAt = in.StartedAt.UTC()
	if in.StartedAt.IsZero() {
		e.StartedAt = now
	}
	reasons := map[string][]api.ChangeReason{}
	for _, r := range in.Reasons {
		reasons[r.Stack] = append(reasons[r.Stack], r)
	}
	var ack api.Ack
	err := s.Store.Write(ctx, func(tx store.Tx) error {
		created, err := tx.CreateExecution(e)
		if err != nil {
			return err
		}
		if !created {
			cur, err := tx.Execution(e.ExecutionID)
			if err != nil {
				return err
			}
			ack = ackOf(cur)
			return nil
		}
		for _, name := range in.Stacks {
			st := &store.Stack{}
			st.StackState.Stack, st.Status, st.Reasons, st.UpdatedAt = name, events.StackPending, reasons[name], now
			if err := tx.SaveStack(e.ExecutionID, st); err != nil {
				return err
			}
		}
		return tx.Notify(e.ExecutionID)
	})
	return ack, err
}

// CheckName is the check a PR's executions of op conclude.
func CheckName(op api.ExecutionOp) string { return "tfstackplan/" + string(op) }

func conclusion(status api.ExecutionStatus) string {
	switch status {
	case events.ExecutionSucceeded:
		return "success"
	case events.ExecutionCancelled:
		return "cancelled"
	default:
		return "failure"
	}
}

func changed(c api.Class) bool { return c != "" && c != events.ClassNoChanges }

// Finalize ends an execution (the first finalize wins). A successful plan of a PR claims its
// changed stacks in the environment and records the gates they need; a successful apply releases
// the PR's claims; either concludes the PR's check.
func (s *Service) Finalize(ctx context.Context, in *api.Finalize) (api.Ack, error) {
	if err := checkName("execution_id", in.ExecutionID); err != nil {
		return api.Ack{}, err
	}
	if !in.Status.Valid() || in.Status == events.ExecutionRunning {
		return api.Ack{}, invalid("status %q is not a final execution status", in.Status)
	}
	if in.Class != "" && !in.Class.Valid() {
		return api.Ack{}, invalid("class %q is not a change class", in.Class)
	}
	for _, r := range in.Stacks {
		if err := checkName("stack", r.Stack); err != nil {
			return api.Ack{}, err
		}
		if !r.Status.Valid() || (r.Class != "" && !r.Class.Valid()) {
			return api.Ack{}, invalid("stack %q: bad status %q or class %q", r.Stack, r.Status, r.Class)
		}
	}
	now := s.Now()
	var ack api.Ack
	err := s.Store.Write(ctx, func(tx store.Tx) error {
		e, err := tx.Execution(in.ExecutionID)
		if err != nil {
			return err
		}
		ack = ackOf(e)
		if e.Finalized {
			return nil
		}
		e.Finalized, e.Status, e.Counts, e.Error = true, in.Status, in.Counts, clip(in.Error, MaxTextLen)
		if e.Cancelled {
			e.Status = events.ExecutionCancelled // a cancelled execution never concludes as a success
		}
		e.FinishedAt = in.FinishedAt.UTC()
		if in.FinishedAt.IsZero() {
			e.FinishedAt = now
		}
		for _, r := range in.Stacks {
			st, err := s.stackOrNew(tx, e.ExecutionID, r.Stack)
			if err != nil {
				return err
			}
			st.Status, st.UpdatedAt = r.Status, now
			if r.Class != "" {
				st.Class = r.Class
			}
			if r.Counts != (api.Counts{}) {
				st.Counts = r.Counts
			}
			if r.PlanHash != "" {
				st.PlanHash = r.PlanHash
			}
			if err := tx.SaveStack(e.ExecutionID, st); err != nil {
				return err
			}
		}
		stacks, err := tx.Stacks(e.ExecutionID)
		if err != nil {
			return err
		}
		e.Class = in.Class
		if e.Class == "" {
			for _, st := range stacks {
				e.Class = events.MaxClass(e.Class, st.Class)
			}
		}
		if err := tx.SaveExecution(e); err != nil {
			return err
		}
		if e.PR != 0 {
			if err := s.settlePR(tx, e, stacks, now); err != nil {
				return err
			}
		}
		return tx.Notify(e.ExecutionID)
	})
	return ack, err
}

// settlePR applies a finalized execution's consequences for its PR: claims, gates and the check.
func (s *Service) settlePR(tx store.Tx, e *store.Execution, stacks []store.Stack, now time.Time) error {
	if err := tx.LockEnvironment(e.Environment); err != nil {
		return err
	}
	switch {
	case e.Op == api.ExecutionOp(events.OpPlan) && e.Status == events.ExecutionSucceeded:
		classes := map[string]events.Class{}
		for _, st := range stacks {
			if changed(st.Class) {
				classes[st.Stack] = st.Class
			}
		}
		claims, err := tx.Claims(e.Environment, now)
		if err != nil {
			return err
		}
		for _, c := range claims {
			if c.PR == e.PR {
				if _, still := classes[c.Stack]; !still {
					if _, err := tx.ReleaseClaims(e.Environment, e.PR, c.Stack); err != nil {
						return err
					}
				}
			}
		}
		held := map[string]int{}
		for _, c := range claims {
			held[c.Stack] = c.PR
		}
		for stack := range classes {
			if pr, ok := held[stack]; ok && pr != e.PR {
				continue // another PR holds it; that PR's apply or release frees it
			}
			if err := tx.PutClaim(api.Claim{Environment: e.Environment, Stack: stack, PR: e.PR,
				ExecutionID: e.ExecutionID, SHA: e.SHA, ClaimedAt: now, ExpiresAt: now.Add(s.ttl(e.Environment, false))}); err != nil {
				return err
			}
		}
		gates := s.Policy.RequiredGates(e.Environment, classes)
		for i := range gates {
			gates[i].PR, gates[i].ExecutionID = e.PR, e.ExecutionID
		}
		if err := tx.ReplaceGates(e.Environment, e.PR, gates); err != nil {
			return err
		}
	case e.Op == api.ExecutionOp(events.OpApply) && e.Status == events.ExecutionSucceeded:
		if _, err := tx.ReleaseClaims(e.Environment, e.PR, ""); err != nil {
			return err
		}
	}
	return tx.PutCheck(api.Check{Environment: e.Environment, PR: e.PR, Check: CheckName(e.Op),
		Conclusion: conclusion(e.Status), UpdatedAt: now})
}

// GateCheck decides, fail-closed, whether an apply may proceed, and leases the requester when
// it may. Every decision is audited.
func (s *Service) GateCheck(ctx context.Context, principal string, in *api.GateCheck) (api.GateLease, error) {
	if err := checkNames("execution_id", in.ExecutionID, "environment", in.Environment); err != nil {
		return api.GateLease{}, err
	}
	if in.PR <= 0 {
		return api.GateLease{}, invalid("pr must be a positive pull request number")
	}
	if strings.TrimSpace(in.SHA) == "" {
		return api.GateLease{}, invalid("sha is required: a gate is checked against the plan of one commit")
	}
	if len(in.Stacks) == 0 {
		return api.GateLease{}, invalid("stacks is required: name every stack the apply changes with its plan hash")
	}
	for _, sp := range in.Stacks {
		if err := checkName("stack", sp.Stack); err != nil {
			return api.GateLease{}, err
		}
	}
	now := s.Now()
	target := fmt.Sprintf("%s PR #%d", in.Environment, in.PR)
	var lease api.GateLease
	var decision error
	err := s.Store.Write(ctx, func(tx store.Tx) error {
		if err := tx.LockEnvironment(in.Environment); err != nil {
			return err
		}
		deny := func(err error) error {
			decision = err
			return audit(tx, now, principal, "gate.check", target, "", "denied", err.Error())
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
		if l, err := tx.Lease(in.ExecutionID); err == nil {
			switch {
			case l.Environment != in.Environment || l.PR != in.PR:
				return deny(fmt.Errorf("%w: execution %s already holds a lease for %s PR #%d, not %s", store.ErrDenied, in.ExecutionID, l.Environment, l.PR, target))
			case !l.RevokedAt.IsZero():
				return deny(fmt.Errorf("%w: the lease of execution %s was already revoked", store.ErrDenied, in.ExecutionID))
			case !now.Before(l.ExpiresAt):
				return deny(fmt.Errorf("%w: the lease of execution %s expired at %s", store.ErrDenied, in.ExecutionID, l.ExpiresAt.UTC().Format(time.RFC3339)))
			}
			lease = api.GateLease{Requester: l.Requester, ExpiresAt: l.ExpiresAt}
			return audit(tx, now, principal, "gate.check", target, "", "allowed",
				fmt.Sprintf("repeat of execution %s, requester %s", in.ExecutionID, l.Requester))
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		requester := s.Policy.Environments[in.Environment].Requester
		if requester == "" {
			return deny(fmt.Errorf("%w: the policy names no requester for environment %q", store.ErrPrecondition, in.Environment))
		}
		plan, stacks, err := s.decide(tx, in, now)
		if err != nil {
			if errors.Is(err, store.ErrUnavailable) {
				return err
			}
			return deny(err)
		}
		l := store.Lease{ExecutionID: in.ExecutionID, Environment: in.Environment, PR: in.PR,
			Requester: requester, GrantedAt: now, ExpiresAt: now.Add(s.ttl(in.Environment, true))}
		if err := tx.PutLease(l); err != nil {
			return err
		}
		lease = api.GateLease{Requester: l.Requester, ExpiresAt: l.ExpiresAt}
		return audit(tx, now, principal, "gate.check", target, "", "allowed",
			fmt.Sprintf("plan %s, stacks %s, requester %s", plan.ExecutionID, strings.Join(stacks, ", "), l.Requester))
	})
	if err != nil {
		return api.GateLease{}, err
	}
	return lease, decision
}

// decide applies the gate rules; it returns the plan and the stacks it allowed.
func (s *Service) decide(tx store.Tx, in *api.GateCheck, now time.Time) (*store.Execution, []string, error) {
	at := " at commit " + in.SHA
	plan, err := tx.LatestPlan(in.Environment, in.PR, in.SHA)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil, fmt.Errorf("%w: PR #%d has no plan for environment %q%s", store.ErrPrecondition, in.PR, in.Environment, at)
	}
	if err != nil {
		return nil, nil, err
	}
	if !plan.Finalized {
		return nil, nil, fmt.Errorf("%w: the latest plan %s of PR #%d in %q%s is not finalized", store.ErrPrecondition, plan.ExecutionID, in.PR, in.Environment, at)
	}
	if plan.Cancelled {
		return nil, nil, fmt.Errorf("%w: the latest plan %s of PR #%d in %q%s was cancelled", store.ErrPrecondition, plan.ExecutionID, in.PR, in.Environment, at)
	}
	if plan.Status != events.ExecutionSucceeded {
		return nil, nil, fmt.Errorf("%w: the latest plan %s of PR #%d in %q%s ended %s", store.ErrPrecondition, plan.ExecutionID, in.PR, in.Environment, at, plan.Status)
	}
	planned, err := tx.Stacks(plan.ExecutionID)
	if err != nil {
		return nil, nil, err
	}
	byName := map[string]store.Stack{}
	for _, st := range planned {
		byName[st.Stack] = st
	}
	var names []string
	for _, sp := range in.Stacks {
		st, ok := byName[sp.Stack]
		if !ok {
			return nil, nil, fmt.Errorf("%w: stack %q is not in plan %s", store.ErrDenied, sp.Stack, plan.ExecutionID)
		}
		if changed(st.Class) && st.PlanHash == "" {
			return nil, nil, fmt.Errorf("%w: plan %s recorded no plan hash for changed stack %q", store.ErrDenied, plan.ExecutionID, sp.Stack)
		}
		if st.PlanHash != sp.PlanHash {
			return nil, nil, fmt.Errorf("%w: the plan hash of stack %q differs from the one finalized by plan %s (stale plan)", store.ErrDenied, sp.Stack, plan.ExecutionID)
		}
		names = append(names, sp.Stack)
	}
	claims, err := tx.Claims(in.Environment, now)
	if err != nil {
		return nil, nil, err
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	for _, c := range claims {
		if want[c.Stack] && c.PR != in.PR {
			return nil, nil, fmt.Errorf("%w: stack %q is claimed by PR #%d (execution %s) in %q", store.ErrDenied, c.Stack, c.PR, c.ExecutionID, in.Environment)
		}
	}
	// The gates come from the policy applied to the plan being applied (not from the gates the
	// PR's latest finalize recorded, which may be another commit's).
	classes := map[string]events.Class{}
	for n := range want {
		if c := byName[n].Class; changed(c) {
			classes[n] = c
		}
	}
	var missing []string
	for _, g := range s.Policy.RequiredGates(in.Environment, classes) {
		grants, err := tx.Grants(store.GrantFilter{Environment: in.Environment, PR: in.PR, Class: g.Class, Target: g.Target, ActiveAt: now})
		if err != nil {
			return nil, nil, err
		}
		if len(grants) == 0 {
			missing = append(missing, fmt.Sprintf("%s on %s (stacks %s)", g.Class, g.Target, strings.Join(g.Stacks, ", ")))
		}
	}
	if len(missing) > 0 {
		return nil, nil, fmt.Errorf("%w: no active grant for gate %s", store.ErrDenied, strings.Join(missing, "; "))
	}
	sort.Strings(names)
	return plan, names, nil
}

// GateRevoke ends an apply's lease; a successful outcome releases the PR's claims.
func (s *Service) GateRevoke(ctx context.Context, principal string, in *api.GateRevoke) (api.Ack, error) {
	if err := checkName("execution_id", in.ExecutionID); err != nil {
		return api.Ack{}, err
	}
	now := s.Now()
	return api.Ack{}, s.Store.Write(ctx, func(tx store.Tx) error {
		env, pr := in.Environment, in.PR
		l, err := tx.Lease(in.ExecutionID)
		switch {
		case errors.Is(err, store.ErrNotFound):
			l = nil
		case err != nil:
			return err
		default:
			env, pr = l.Environment, l.PR
		}
		changedSomething := false
		if l != nil && l.RevokedAt.IsZero() {
			l.RevokedAt, l.Outcome = now, clip(in.Outcome, 64)
			if err := tx.PutLease(*l); err != nil {
				return err
			}
			changedSomething = true
		}
		ended := int64(0)
		if env != "" && pr != 0 {
			if err := tx.LockEnvironment(env); err != nil {
				return err
			}
			if in.Outcome == "succeeded" {
				n, err := tx.ReleaseClaims(env, pr, "")
				if err != nil {
					return err
				}
				changedSomething = changedSomething || n > 0
			}
			// The apply the grants were given for is over: a later apply needs a fresh grant.
			if ended, err = endGrants(tx, env, pr, principal, now); err != nil {
				return err
			}
			changedSomething = changedSomething || ended > 0
		}
		if !changedSomething {
			return nil
		}
		return audit(tx, now, principal, "gate.revoke", fmt.Sprintf("%s PR #%d", env, pr), "", clip(in.Outcome, 64),
			fmt.Sprintf("execution %s, %d grants ended", in.ExecutionID, ended))
	})
}

// endGrants ends every grant of pr in env active at now; it returns how many.
func endGrants(tx store.Tx, env string, pr int, by string, now time.Time) (int64, error) {
	active, err := tx.Grants(store.GrantFilter{Environment: env, PR: pr, ActiveAt: now})
	if err != nil {
		return 0, err
	}
	done := map[[2]string]bool{}
	var total int64
	for _, g := range active {
		key := [2]string{g.Class, g.Target}
		if done[key] {
			continue
		}
		done[key] = true
		n, err := tx.ReleaseGrants(env, pr, g.Class, g.Target, by, now)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// Claims lists current claims (env empty: every environment).
func (s *Service) Claims(ctx context.Context, env string) ([]api.Claim, error) {
	var out []api.Claim
	err := s.Store.Read(ctx, func(tx store.Tx) (err error) { out, err = tx.Claims(env, s.Now()); return })
	return out, err
}

// ReleaseClaims releases one stack's claim, or all of a PR's claims in an environment.
func (s *Service) ReleaseClaims(ctx context.Context, principal string, in *api.ClaimsRelease) (api.Ack, error) {
	if err := checkName("environment", in.Environment); err != nil {
		return api.Ack{}, err
	}
	if in.PR <= 0 {
		return api.Ack{}, invalid("pr must be a positive pull request number")
	}
	now := s.Now()
	return api.Ack{}, s.Store.Write(ctx, func(tx store.Tx) error {
		if err := tx.LockEnvironment(in.Environment); err != nil {
			return err
		}
		n, err := tx.ReleaseClaims(in.Environment, in.PR, in.Stack)
		if err != nil || n == 0 {
			return err
		}
		what := "all stacks"
		if in.Stack != "" {
			what = "stack " + in.Stack
		}
		return audit(tx, now, principal, "claims.release", fmt.Sprintf("%s PR #%d", in.Environment, in.PR), "", "released", fmt.Sprintf("%s (%d claims)", what, n))
	})
}

// Checks lists check conclusions.
func (s *Service) Checks(ctx context.Context, env string, pr int) ([]api.Check, error) {
	var out []api.Check
	err := s.Store.Read(ctx, func(tx store.Tx) (err error) { out, err = tx.Checks(env, pr); return })
	return out, err
}

// OverrideCheck sets a check's conclusion by hand until the PR's next execution concludes it.
func (s *Service) OverrideCheck(ctx context.Context, principal string, in *api.ChecksOverride) (api.Ack, error) {
	if err := checkNames("environment", in.Environment, "check", in.Check); err != nil {
		return api.Ack{}, err
	}
	if in.PR <= 0 {
		return api.Ack{}, invalid("pr must be a positive pull request number")
	}
	if !in.Conclusion.Valid() {
		return api.Ack{}, invalid("conclusion %q is not a check conclusion", in.Conclusion)
	}
	if strings.TrimSpace(in.Reason) == "" {
		return api.Ack{}, invalid("reason is required")
	}
	now := s.Now()
	return api.Ack{}, s.Store.Write(ctx, func(tx store.Tx) error {
		cur, err := tx.Check(in.Environment, in.PR, in.Check)
		if err == nil && cur.Overridden && cur.Conclusion == string(in.Conclusion) && cur.Reason == in.Reason {
			return nil
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if err := tx.PutCheck(api.Check{Environment: in.Environment, PR: in.PR, Check: in.Check,
			Conclusion: string(in.Conclusion), Overridden: true, Reason: clip(in.Reason, MaxTextLen), UpdatedAt: now}); err != nil {
			return err
		}
		return audit(tx, now, principal, "checks.override", fmt.Sprintf("%s PR #%d %s", in.Environment, in.PR, in.Check), in.Reason, string(in.Conclusion), "")
	})
}

// CancelExecution marks an execution cancelled; the runner learns it from its next event's Ack.
func (s *Service) CancelExecution(ctx context.Context, principal string, in *api.ExecutionsCancel) (api.Ack, error) {
	if err := checkName("execution_id", in.ExecutionID); err != nil {
		return api.Ack{}, err
	}
	if strings.TrimSpace(in.Reason) == "" {
		return api.Ack{}, invalid("reason is required")
	}
	now := s.Now()
	var ack api.Ack
	err := s.Store.Write(ctx, func(tx store.Tx) error {
		e, err := tx.Execution(in.ExecutionID)
		if err != nil {
			return err
		}
		if e.Cancelled {
			ack = ackOf(e)
			return nil
		}
		e.Cancelled, e.CancelReason = true, clip(in.Reason, MaxTextLen)
		if !e.Finalized {
			e.Status = events.ExecutionCancelled
		}
		if err := tx.SaveExecution(e); err != nil {
			return err
		}
		ack = ackOf(e)
		if err := audit(tx, now, principal, "executions.cancel", in.ExecutionID, in.Reason, "cancelled", ""); err != nil {
			return err
		}
		return tx.Notify(e.ExecutionID)
	})
	return ack, err
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
	if err := checkGlob(target); err != nil {
		return invalid("target: %v", err)
	}
	if strings.TrimSpace(reason) == "" {
		return invalid("reason is required")
	}
	return nil
}

// SatisfyGate grants a gate; an active grant with the same key is not duplicated.
func (s *Service) SatisfyGate(ctx context.Context, principal string, in *api.GatesSatisfy) (api.Ack, error) {
	if err := checkGrantKey(in.Environment, in.PR, in.Class, in.Target, in.Reason); err != nil {
		return api.Ack{}, err
	}
	now := s.Now()
	if !in.ExpiresAt.IsZero() && !in.ExpiresAt.After(now) {
		return api.Ack{}, invalid("expires_at %s is in the past", in.ExpiresAt.Format(time.RFC3339))
	}
	return api.Ack{}, s.Store.Write(ctx, func(tx store.Tx) error {
		if err := tx.LockEnvironment(in.Environment); err != nil {
			return err
		}
		active, err := tx.Grants(store.GrantFilter{Environment: in.Environment, PR: in.PR, Class: in.Class, Target: in.Target, ActiveAt: now})
		if err != nil || len(active) > 0 {
			return err
		}
		if _, err := tx.AddGrant(api.Grant{Environment: in.Environment, PR: in.PR, Class: in.Class, Target: in.Target,
			Principal: principal, Reason: clip(in.Reason, MaxTextLen), GrantedAt: now, ExpiresAt: in.ExpiresAt.UTC()}); err != nil {
			return err
		}
		detail := ""
		if !in.ExpiresAt.IsZero() {
			detail = "expires " + in.ExpiresAt.UTC().Format(time.RFC3339)
		}
		return audit(tx, now, principal, "gates.satisfy", fmt.Sprintf("%s PR #%d %s on %s", in.Environment, in.PR, in.Class, in.Target), in.Reason, "granted", detail)
	})
}

// ReleaseGrant ends the active grants with the key; releasing nothing is not an error.
func (s *Service) ReleaseGrant(ctx context.Context, principal string, in *api.GrantsRelease) (api.Ack, error) {
	if err := checkGrantKey(in.Environment, in.PR, in.Class, in.Target, in.Reason); err != nil {
		return api.Ack{}, err
	}
	now := s.Now()
	return api.Ack{}, s.Store.Write(ctx, func(tx store.Tx) error {
		if err := tx.LockEnvironment(in.Environment); err != nil {
			return err
		}
		n, err := tx.ReleaseGrants(in.Environment, in.PR, in.Class, in.Target, principal, now)
		if err != nil || n == 0 {
			return err
		}
		return audit(tx, now, principal, "grants.release", fmt.Sprintf("%s PR #%d %s on %s", in.Environment, in.PR, in.Class, in.Target), in.Reason, "released", "")
	})
}

// Gates lists required gates with whether an active grant satisfies each.
func (s *Service) Gates(ctx context.Context, env string, pr int) ([]api.Gate, error) {
	var out []api.Gate
	now := s.Now()
	err := s.Store.Read(ctx, func(tx store.Tx) error {
		gates, err := tx.Gates(env, pr)
		if err != nil {
			return err
		}
		for _, g := range gates {
			grants, err := tx.Grants(store.GrantFilter{Environment: g.Environment, PR: g.PR, Class: g.Class, Target: g.Target, ActiveAt: now})
			if err != nil {
				return err
			}
			g.Satisfied = len(grants) > 0
			out = append(out, g)
		}
		return nil
	})
	return out, err
}

// Grants lists grants, newest first.
func (s *Service) Grants(ctx context.Context, env string, pr int) ([]api.Grant, error) {
	var out []api.Grant
	err := s.Store.Read(ctx, func(tx store.Tx) (err error) {
		out, err = tx.Grants(store.GrantFilter{Environment: env, PR: pr})
		return
	})
	return out, err
}

// Executions lists executions newest first, without their stacks.
func (s *Service) Executions(ctx context.Context, f store.ExecutionFilter) ([]api.Execution, error) {
	if f.Limit <= 0 || f.Limit > 500 {
		f.Limit = 50
	}
	var rows []store.Execution
	if err := s.Store.Read(ctx, func(tx store.Tx) (err error) { rows, err = tx.Executions(f); return }); err != nil {
		return nil, err
	}
	out := make([]api.Execution, 0, len(rows))
	for _, r := range rows {
		r.Edges = nil
		out = append(out, r.Execution)
	}
	return out, nil
}

// Execution returns one execution with its stacks, edges and log summaries.
func (s *Service) Execution(ctx context.Context, id string) (*api.Execution, error) {
	var out *api.Execution
	err := s.Store.Read(ctx, func(tx store.Tx) error {
		e, err := tx.Execution(id)
		if err != nil {
			return err
		}
		stacks, err := tx.Stacks(id)
		if err != nil {
			return err
		}
		logs, err := tx.LogSummaries(id)
		if err != nil {
			return err
		}
		byStack := map[string]store.LogSummary{}
		for _, l := range logs {
			byStack[l.Stack] = l
		}
		x := e.Execution
		for _, st := range stacks {
			state := st.StackState
			if l, ok := byStack[st.Stack]; ok {
				state.LogGeneration, state.LogBytes, state.Gaps = l.Generation, l.Bytes, l.Gaps
			}
			x.Stacks = append(x.Stacks, state)
		}
		out = &x
		return nil
	})
	return out, err
}

// Audit lists audit entries newest first.
func (s *Service) Audit(ctx context.Context, limit int, before int64) ([]api.AuditEntry, error) {
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	var out []api.AuditEntry
	err := s.Store.Read(ctx, func(tx store.Tx) (err error) { out, err = tx.Audit(limit, before); return })
	return out, err
}

// Ping reports whether the store answers.
func (s *Service) Ping(ctx context.Context) error { return s.Store.Ping(ctx) }
