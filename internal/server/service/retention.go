package service

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Retention and quotas: what keeps one runner (or a leaked token) from filling the disk.

// pruneBatch is how many executions one retention transaction deletes.
const pruneBatch = 100

// PruneExecutions deletes the finished executions that the server received (Init) and that
// finished (by a time no later than the server received the Finalize) more than retain ago, with their stacks, phases and logs, a transaction of pruneBatch at a time, and returns
// how many it deleted. It never deletes what something live still needs (see
// store.Tx.PruneExecutions): a plan a claim, a gate, an active grant or a lease names, or the
// latest plan of a PR.
func (s *Service) PruneExecutions(ctx context.Context, retain time.Duration) (int64, error) {
	now := s.Now()
	before := now.Add(-retain)
	var total int64
	for {
		var n int64
		err := s.Store.Write(ctx, func(tx store.Tx) (err error) { n, err = tx.PruneExecutions(before, now, pruneBatch); return })
		total += n
		if err != nil || n < pruneBatch {
			return total, err
		}
	}
}

// notAfter is t, a time a runner sent, or now when t is later: a finish dated ahead of the
// server's clock ("2199") would keep its execution from retention for good.
func notAfter(t, now time.Time) time.Time {
	if t.After(now) {
		return now
	}
	return t
}

// Quotas bounds what one principal may make the server store (0: unbounded).
type Quotas struct {
	// ExecutionsPerHour bounds the executions one principal announces in any hour.
	ExecutionsPerHour int
	// LogBytesPerExecution bounds the log bytes stored for one execution, about: each replica
	// counts the bytes it stored itself, from what the execution had when it first saw it, and
	// the request that reaches the bound is stored whole.
	LogBytesPerExecution int64
}

// QuotaError is a request refused because a quota is used up; RetryAfter says when it may
// succeed again.
type QuotaError struct {
	Msg  string
	Wait time.Duration
}

// Error says which quota is used up.
func (e *QuotaError) Error() string { return e.Msg }

// RetryAfter is when the request may succeed again.
func (e *QuotaError) RetryAfter() time.Duration { return e.Wait }

// Is makes a QuotaError a store.ErrQuota.
func (e *QuotaError) Is(target error) bool { return target == store.ErrQuota }

// checkExecutionQuota refuses a new execution of a principal that announced
// Quotas.ExecutionsPerHour in the last hour (admins are not counted). The GitHub Actions jobs of
// one repository count together: each run is a principal of its own, and one repository would
// otherwise have the quota as many times as it starts runs.
func (s *Service) checkExecutionQuota(tx store.Tx, caller Caller, repo string, now time.Time) error {
	limit := s.Quotas.ExecutionsPerHour
	if limit <= 0 || caller.Admin {
		return nil
	}
	var n int
	var first time.Time
	var err error
	who := fmt.Sprintf("principal %q", caller.Name)
	if caller.GitHub != nil {
		n, first, err = tx.RepoExecutionsSince(repo, GitHubPrefix, now.Add(-time.Hour), limit)
		who = fmt.Sprintf("the GitHub Actions jobs of %s", repo)
	} else {
		n, first, err = tx.ExecutionsSince(caller.Name, now.Add(-time.Hour), limit)
	}
	if err != nil || n < limit {
		return err
	}
	return &QuotaError{Wait: max(first.Add(time.Hour).Sub(now), time.Second),
		Msg: fmt.Sprintf("%s: %s announced %d executions in the last hour, the most they may", store.ErrQuota, who, n)}
}

// GitHubPrefix starts the name of every GitHub Actions job's principal (auth.GitHubPrincipalPrefix).
const GitHubPrefix = "github:"

// LogQuotaWait is the Retry-After of a log refused for the log-bytes quota: the execution's
// logs never shrink while it runs, so it is as good as never.
const LogQuotaWait = time.Hour

// logCounter counts, per execution, the log bytes this replica knows stored.
type logCounter struct {
	mu sync.Mutex
	n  map[string]int64
}

// checkLogQuota refuses log bytes for an execution whose logs reached
// Quotas.LogBytesPerExecution, and otherwise counts the n bytes as stored (uncountLog gives
// them back when the write stored nothing): a request that reaches the limit is taken whole,
// so that a resend of bytes already stored is never refused before the limit is reached.
func (s *Service) checkLogQuota(ctx context.Context, execID string, n int64) error {
	limit := s.Quotas.LogBytesPerExecution
	if limit <= 0 {
		return nil
	}
	c := &s.logBytes
	c.mu.Lock()
	used, ok := c.n[execID]
	c.mu.Unlock()
	if !ok {
		if err := s.Store.Read(ctx, func(tx store.Tx) (err error) { used, err = tx.LogBytes(execID); return }); err != nil {
			return err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil || len(c.n) >= maxSeenKept {
		c.n = map[string]int64{}
	}
	if cur, ok := c.n[execID]; ok {
		used = cur
	}
	if used >= limit {
		c.n[execID] = used
		return &QuotaError{Wait: LogQuotaWait, Msg: fmt.Sprintf("%s: execution %q has %d bytes of logs stored, the %d bytes an execution may have",
			store.ErrQuota, execID, used, limit)}
	}
	c.n[execID] = used + n
	return nil
}

// uncountLog gives back n log bytes counted by checkLogQuota for a write that failed.
func (s *Service) uncountLog(execID string, n int64) {
	c := &s.logBytes
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.n[execID]; ok {
		c.n[execID] = max(cur-n, 0)
	}
}
