package service

import (
	"context"
	"sync"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Liveness: an execution whose runner went away (killed, its machine lost, the server
// unreachable until the job ended) would read `running` for good. The driver heartbeats while
// it runs; the server fails an execution it has heard nothing of for a while (SweepStale).

// StaleError is the error of an execution SweepStale failed.
const StaleError = "runner stopped reporting"

// MinStaleAfter is the shortest silence SweepStale may be asked to take for a runner gone: two
// of the driver's heartbeats (every 30 s), and SeenEvery.
const MinStaleAfter = time.Minute

// SeenEvery is how often, at most, the runner events of one execution record that the server
// heard from it (one write per execution per replica): often enough for any --stale-after of
// a minute or more, rare enough that a busy log costs nothing.
const SeenEvery = 30 * time.Second

// maxSeenKept bounds the executions the service remembers seeing (beyond it, it forgets them
// all: each then costs one more write).
const maxSeenKept = 10000

// seenCache remembers when this replica last recorded hearing from each execution.
type seenCache struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// due reports whether an event of execID at now should be recorded, and notes it.
func (c *seenCache) due(execID string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.last[execID]; ok && now.Sub(t) < SeenEvery && !now.Before(t) {
		return false
	}
	if c.last == nil || len(c.last) >= maxSeenKept {
		c.last = map[string]time.Time{}
	}
	c.last[execID] = now
	return true
}

// noteSeen records that a runner event of execID was stored, at most once per SeenEvery: the
// events a runner sends count as heartbeats. Best-effort: a failure only delays the record.
func (s *Service) noteSeen(ctx context.Context, execID string) {
	now := s.Now()
	if !s.seen.due(execID, now) {
		return
	}
	_ = s.Store.Write(ctx, func(tx store.Tx) error { return tx.SeeExecution(execID, now) })
}

// Heartbeat records that the runner of an execution is still running it; only the principal
// that announced it (or an admin) sends it. An execution SweepStale failed for its silence,
// and that no Finalize ended since, is running again.
func (s *Service) Heartbeat(ctx context.Context, caller Caller, in *api.Heartbeat) (api.Ack, error) {
	if err := checkName("execution_id", in.ExecutionID); err != nil {
		return api.Ack{}, err
	}
	if err := s.checkOwner(ctx, caller, in.ExecutionID); err != nil {
		return api.Ack{}, err
	}
	now := s.Now()
	var ack api.Ack
	err := s.Store.Write(ctx, func(tx store.Tx) error {
		e, err := tx.Execution(in.ExecutionID)
		if err != nil {
			return err
		}
		ack = ackOf(e)
		if err := tx.SeeExecution(in.ExecutionID, now); err != nil {
			return err
		}
		if !wasStale(e) {
			return nil
		}
		e.Status, e.Error, e.FinishedAt = events.ExecutionRunning, "", time.Time{}
		if err := tx.SaveExecution(e); err != nil {
			return err
		}
		return tx.Notify(e.ExecutionID)
	})
	return ack, err
}

// wasStale reports whether SweepStale failed e and nothing ended it since.
func wasStale(e *store.Execution) bool {
	return !e.Finalized && !e.Cancelled && e.Status == events.ExecutionFailed && e.Error == StaleError
}

// SweepStale fails up to limit executions that are running and that the server has heard
// nothing of (no Init, event or heartbeat) for staleAfter, with the error StaleError, and
// returns how many it failed. It changes nothing else: the execution is not finalized (the
// runner's Finalize, should it come, still ends it as the runner says) and releases nothing,
// neither claims nor gates nor a lease an apply may still hold.
func (s *Service) SweepStale(ctx context.Context, staleAfter time.Duration, limit int) (int, error) {
	now := s.Now()
	before := now.Add(-staleAfter)
	failed := 0
	err := s.Store.Write(ctx, func(tx store.Tx) error {
		failed = 0
		ids, err := tx.StaleExecutions(before, limit)
		if err != nil {
			return err
		}
		for _, id := range ids {
			e, err := tx.Execution(id)
			if err != nil {
				return err
			}
			if e.Finalized || e.Cancelled || e.Status != events.ExecutionRunning {
				continue
			}
			e.Status, e.Error, e.FinishedAt = events.ExecutionFailed, StaleError, now
			if err := tx.SaveExecution(e); err != nil {
				return err
			}
			detail := "no event for " + staleAfter.String()
			if err := audit(tx, now, Caller{Name: "tfstackplan"}, e.Repo, "executions.stale", id, StaleError, "failed", detail); err != nil {
				return err
			}
			if err := s.notifyStale(tx, e, staleAfter, now); err != nil {
				return err
			}
			if err := tx.Notify(id); err != nil {
				return err
			}
			failed++
		}
		return nil
	})
	return failed, err
}

// RunStaleSweeper fails stale executions (SweepStale) every interval until ctx ends. It starts
// staleAfter after it is called: the runners that lost the server while it was down have that
// long to reach it again before their executions count as stale.
func (s *Service) RunStaleSweeper(ctx context.Context, staleAfter, interval time.Duration, onErr func(error)) {
	wait := time.NewTimer(staleAfter)
	defer wait.Stop()
	select {
	case <-ctx.Done():
		return
	case <-wait.C:
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		for {
			n, err := s.SweepStale(ctx, staleAfter, 100)
			if err != nil && onErr != nil && ctx.Err() == nil {
				onErr(err)
			}
			if err != nil || n < 100 {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
