package service

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Gates and grants: which gates a plan requires under the policy, and which grants approved its
// content.

// grantsFor returns the grants that satisfy each gate plan (with its stacks) requires now, or
// ErrDenied naming the gates no active grant approved this plan's content for.
func (s *Service) grantsFor(tx store.Tx, plan *store.Execution, stacks []store.Stack, now time.Time) ([]int64, error) {
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
	return grantIDs, nil
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
