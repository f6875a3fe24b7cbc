package service

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Claims: a PR's finalized plan claims its changed stacks; another PR's apply on them is denied.

// claimConflict denies an apply of k's PR on stacks another PR of its repository and environment
// claims at now, naming the first such claim.
func claimConflict(tx store.Tx, k store.PRKey, stacks []string, now time.Time) error {
	conflicts, err := conflictsOf(tx, k, stacks, now)
	if err != nil || len(conflicts) == 0 {
		return err
	}
	c := conflicts[0]
	return fmt.Errorf("%w: stack %q is claimed by PR #%d (execution %s) in %q", store.ErrDenied, c.Stacks[0], c.PR, c.ExecutionID, k.Environment)
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
	if why := prConfined(caller, in.PR); why != "" {
		return api.Ack{}, fmt.Errorf("%w: %s", store.ErrDenied, why)
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
