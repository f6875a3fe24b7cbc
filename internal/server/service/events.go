package service

import (
	"context"
	"errors"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Runner events that change a stack: phases and updates.

// eventAck is the Ack of a runner event on execID: whether the runner must stop.
func eventAck(tx store.Tx, execID string) (api.Ack, error) {
	cancelled, reason, err := tx.ExecutionCancel(execID)
	return cancelAck(cancelled, reason), err
}

// lockForEvent reads (and, inside Write, locks) the execution a stack event names: the lock
// serializes the read-modify-write of its stacks with every other event, finalize and cancel
// on the execution. It returns the event's Ack and whether the execution is finalized (a
// finalized execution's stack state no longer changes).
func lockForEvent(tx store.Tx, execID string) (api.Ack, bool, error) {
	st, err := tx.EventState(execID)
	if err != nil {
		return api.Ack{}, false, err
	}
	return cancelAck(st.Cancelled, st.CancelReason), st.Finalized, nil
}

func (s *Service) stackOrNew(tx store.Tx, execID, name string) (*store.Stack, error) {
	st, err := tx.Stack(execID, name)
	if errors.Is(err, store.ErrNotFound) {
		st = &store.Stack{}
		st.StackState.Stack, st.Status = name, events.StackPending
		return st, nil
	}
	return st, err
}

// Phase records that a stack entered a phase; the stack shows its latest phase by seq.
func (s *Service) Phase(ctx context.Context, in *api.PhaseEvent) (api.Ack, error) {
	return s.Phases(ctx, []api.PhaseEvent{*in})
}

// MaxPhases bounds the events of one Phases request.
const MaxPhases = 1000

// Phases stores several phase events of one execution in one transaction, each as Phase
// would: a phase history entry (idempotent), and the stack's current phase when the event is
// the newest and the execution is not finalized.
func (s *Service) Phases(ctx context.Context, phases []api.PhaseEvent) (api.Ack, error) {
	if len(phases) == 0 {
		return api.Ack{}, invalid("phases is empty")
	}
	if len(phases) > MaxPhases {
		return api.Ack{}, invalid("%d phases in one request, more than %d", len(phases), MaxPhases)
	}
	for i := range phases {
		in := &phases[i]
		if err := checkNames("execution_id", in.ExecutionID, "stack", in.Stack, "phase", in.Phase); err != nil {
			return api.Ack{}, err
		}
		if in.ExecutionID != phases[0].ExecutionID {
			return api.Ack{}, invalid("phases name executions %q and %q; one request carries one execution", phases[0].ExecutionID, in.ExecutionID)
		}
	}
	now := s.Now()
	execID := phases[0].ExecutionID
	var ack api.Ack
	err := s.Store.Write(ctx, func(tx store.Tx) error {
		var err error
		var finalized bool
		if ack, finalized, err = lockForEvent(tx, execID); err != nil {
			return err
		}
		notify := false
		for i := range phases {
			changed, err := s.phaseTx(tx, &phases[i], finalized, now)
			if err != nil {
				return err
			}
			notify = notify || changed
		}
		if !notify {
			return nil
		}
		return tx.Notify(execID)
	})
	return ack, err
}

// phaseTx stores one phase event inside a Write of its (locked) execution and reports whether
// anything was stored.
func (s *Service) phaseTx(tx store.Tx, in *api.PhaseEvent, finalized bool, now time.Time) (bool, error) {
	at := in.At.UTC()
	if in.At.IsZero() {
		at = now
	}
	added, err := tx.AddPhase(store.Phase{ExecutionID: in.ExecutionID, Stack: in.Stack, Phase: in.Phase,
		Status: clip(in.Status, MaxNameLen), Message: clip(in.Message, MaxTextLen), Seq: in.Seq, At: at})
	if err != nil || !added {
		return false, err
	}
	if finalized {
		return true, nil // stored and shown in the history, state unchanged
	}
	st, err := s.stackOrNew(tx, in.ExecutionID, in.Stack)
	if err != nil {
		return false, err
	}
	if in.Seq < st.PhaseSeq {
		return true, nil
	}
	st.Phase, st.PhaseSeq, st.UpdatedAt = in.Phase, in.Seq, now
	if in.Status != "" {
		st.Phase = in.Phase + ": " + clip(in.Status, 64)
	}
	if st.Status == events.StackPending {
		st.Status = events.StackRunning
	}
	return true, tx.SaveStack(in.ExecutionID, st)
}

// Update records a stack's status and classification; the highest seq wins.
func (s *Service) Update(ctx context.Context, in *api.Update) (api.Ack, error) {
	if err := checkNames("execution_id", in.ExecutionID, "stack", in.Stack); err != nil {
		return api.Ack{}, err
	}
	if !in.Status.Valid() {
		return api.Ack{}, invalid("status %q is not a stack status", in.Status)
	}
	if in.Class != "" && !in.Class.Valid() {
		return api.Ack{}, invalid("class %q is not a change class", in.Class)
	}
	now := s.Now()
	var ack api.Ack
	err := s.Store.Write(ctx, func(tx store.Tx) error {
		var err error
		var finalized bool
		if ack, finalized, err = lockForEvent(tx, in.ExecutionID); err != nil || finalized {
			return err // a late update must not change a finalized plan's classes or hashes
		}
		st, err := s.stackOrNew(tx, in.ExecutionID, in.Stack)
		if err != nil {
			return err
		}
		if in.Seq < st.Seq {
			return nil
		}
		destructive := in.Destructive
		if len(destructive) > MaxDestructive {
			destructive = destructive[:MaxDestructive]
		}
		st.Seq, st.Status, st.Class, st.Counts, st.PlanHash = in.Seq, in.Status, in.Class, in.Counts, in.PlanHash
		st.Destructive, st.Error, st.UpdatedAt = destructive, clip(in.Error, MaxTextLen), now
		if err := tx.SaveStack(in.ExecutionID, st); err != nil {
			return err
		}
		return tx.Notify(in.ExecutionID)
	})
	return ack, err
}
