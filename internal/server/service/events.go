package service

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Runner events that change a stack: phases and updates.

// oneWriter is implemented by stores that can run a write made of one statement without an
// explicit transaction (sqlstore.DB.WriteOne): a runner event is then one round trip.
type oneWriter interface {
	WriteOne(ctx context.Context, fn func(store.Tx) error) error
}

// writeOne runs fn, which calls one single-statement Tx method (ApplyUpdate, AddPhaseEvent,
// AddLogBatch) and Notify, as cheaply as the store allows.
func (s *Service) writeOne(ctx context.Context, fn func(store.Tx) error) error {
	if w, ok := s.Store.(oneWriter); ok {
		return w.WriteOne(ctx, fn)
	}
	return s.Store.Write(ctx, fn)
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
	// Stack rows are locked in name order, so that two batches naming the same stacks never
	// deadlock; each stack's own events keep their order (the later of equal seqs wins).
	order := make([]*api.PhaseEvent, len(phases))
	for i := range phases {
		order[i] = &phases[i]
	}
	slices.SortStableFunc(order, func(a, b *api.PhaseEvent) int { return strings.Compare(a.Stack, b.Stack) })
	write := s.Store.Write
	if len(order) == 1 {
		write = s.writeOne
	}
	var ack api.Ack
	err := write(ctx, func(tx store.Tx) error {
		notify := false
		for i, in := range order {
			at := in.At.UTC()
			if in.At.IsZero() {
				at = now
			}
			shown := in.Phase
			if in.Status != "" {
				shown = in.Phase + ": " + clip(in.Status, 64)
			}
			// Stored and shown in the history even once the execution is finalized; the stack's
			// state then no longer changes.
			st, added, err := tx.AddPhaseEvent(store.Phase{ExecutionID: in.ExecutionID, Stack: in.Stack, Phase: in.Phase,
				Status: clip(in.Status, MaxNameLen), Message: clip(in.Message, MaxTextLen), Seq: in.Seq, At: at}, shown, now)
			if err != nil {
				return err
			}
			if i == 0 {
				ack = cancelAck(st.Cancelled, st.CancelReason)
			}
			notify = notify || added
		}
		if !notify {
			return nil
		}
		return tx.Notify(execID)
	})
	return ack, err
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
	if err := checkText("plan_hash", in.PlanHash, MaxShortLen); err != nil {
		return api.Ack{}, err
	}
	destructive := in.Destructive
	if len(destructive) > MaxDestructive {
		destructive = destructive[:MaxDestructive]
	}
	for _, addr := range destructive {
		if err := checkText("destructive address", addr, MaxNameLen); err != nil {
			return api.Ack{}, err
		}
	}
	st := &store.Stack{Seq: in.Seq}
	st.StackState.Stack, st.Status, st.Class, st.Counts, st.PlanHash = in.Stack, in.Status, in.Class, in.Counts, in.PlanHash
	st.Destructive, st.Error, st.UpdatedAt = destructive, clip(in.Error, MaxTextLen), s.Now()
	var ack api.Ack
	err := s.writeOne(ctx, func(tx store.Tx) error {
		// A late update must not change a finalized plan's classes or hashes: the store skips it.
		state, applied, err := tx.ApplyUpdate(in.ExecutionID, st)
		if err != nil {
			return err
		}
		ack = cancelAck(state.Cancelled, state.CancelReason)
		if !applied {
			return nil
		}
		return tx.Notify(in.ExecutionID)
	})
	return ack, err
}
