package service

import (
	"context"
	"slices"
	"strings"
	"time"

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

// Phase records that a stack entered a phase; the stack shows its latest phase by seq. Like
// every runner event, only the principal that announced the execution (or an admin) sends it.
func (s *Service) Phase(ctx context.Context, caller Caller, in *api.PhaseEvent) (api.Ack, error) {
	return s.Phases(ctx, caller, []api.PhaseEvent{*in})
}

// MaxPhases bounds the events of one Phases request.
const MaxPhases = 1000

// Phases stores several phase events of one execution in one transaction, each as Phase
// would: a phase history entry (idempotent), and the stack's current phase when the event is
// the newest and the execution is not finalized. A batch costs the store a few statements
// whatever its size (store.Tx.AddPhaseEvents), not three an event.
func (s *Service) Phases(ctx context.Context, caller Caller, phases []api.PhaseEvent) (api.Ack, error) {
	execOf := func(i int) string { return phases[i].ExecutionID }
	err := checkBatch("phases", len(phases), MaxPhases, execOf, func(i int) error {
		in := &phases[i]
		if err := checkNames("execution_id", in.ExecutionID, "phase", in.Phase); err != nil {
			return err
		}
		if err := checkTime("at", in.At); err != nil {
			return err
		}
		return checkStack("stack", in.Stack)
	})
	if err != nil {
		return api.Ack{}, err
	}
	now := s.Now()
	ps, shown := make([]store.Phase, len(phases)), make([]string, len(phases))
	for i := range phases {
		in := &phases[i]
		at := orNow(in.At, now)
		shown[i] = in.Phase
		if in.Status != "" {
			shown[i] = in.Phase + ": " + clip(in.Status, 64)
		}
		// Stored and shown in the history even once the execution is finalized; the stack's
		// state then no longer changes.
		ps[i] = store.Phase{ExecutionID: in.ExecutionID, Stack: in.Stack, Phase: in.Phase,
			Status: clip(in.Status, MaxNameLen), Message: clip(in.Message, MaxTextLen), Seq: in.Seq, At: at}
	}
	stackOf := func(i int) string { return ps[i].Stack }
	return s.writeEvents(ctx, caller, execOf(0), len(ps), stackOf, func(tx store.Tx, order []int) (store.EventState, bool, error) {
		if len(order) == 1 {
			return tx.AddPhaseEvent(ps[0], shown[0], now)
		}
		state, added, err := tx.AddPhaseEvents(execOf(0), permuted(ps, order), permuted(shown, order), now)
		return state, added > 0, err
	})
}

// Update records a stack's status and classification; the highest seq wins.
func (s *Service) Update(ctx context.Context, caller Caller, in *api.Update) (api.Ack, error) {
	return s.Updates(ctx, caller, []api.Update{*in})
}

// MaxUpdates bounds the updates of one Updates request.
const MaxUpdates = 1000

// Updates stores several stack updates of one execution in one transaction, each as Update
// would: the stack's status, class, counts, plan hash, destructive addresses and error, unless
// the stored seq is higher or the execution is finalized. One invalid update refuses them all.
func (s *Service) Updates(ctx context.Context, caller Caller, updates []api.Update) (api.Ack, error) {
	now := s.Now()
	stacks := make([]*store.Stack, len(updates))
	execOf := func(i int) string { return updates[i].ExecutionID }
	err := checkBatch("updates", len(updates), MaxUpdates, execOf, func(i int) (err error) {
		stacks[i], err = updateStack(&updates[i], now)
		return err
	})
	if err != nil {
		return api.Ack{}, err
	}
	stackOf := func(i int) string { return updates[i].Stack }
	// A late update must not change a finalized plan's classes or hashes: the store skips it.
	return s.writeEvents(ctx, caller, execOf(0), len(updates), stackOf, func(tx store.Tx, order []int) (store.EventState, bool, error) {
		if len(order) == 1 {
			return tx.ApplyUpdate(execOf(0), stacks[0])
		}
		state, applied, err := tx.ApplyUpdates(execOf(0), permuted(stacks, order))
		return state, applied > 0, err
	})
}

// checkBatch checks what every batch of runner events must be: not empty, at most max events,
// each valid (check) and naming the execution of the first (execOf).
func checkBatch(what string, n, max int, execOf func(i int) string, check func(i int) error) error {
	if n == 0 {
		return invalid("%s is empty", what)
	}
	if n > max {
		return invalid("%d %s in one request, more than %d", n, what, max)
	}
	for i := range n {
		if err := check(i); err != nil {
			return err
		}
		if execOf(i) != execOf(0) {
			return invalid("%s name executions %q and %q; one request carries one execution", what, execOf(0), execOf(i))
		}
	}
	return nil
}

// permuted returns xs in the order of the indexes in order.
func permuted[T any](xs []T, order []int) []T {
	out := make([]T, len(order))
	for k, i := range order {
		out[k] = xs[i]
	}
	return out
}

// writeEvents writes the n events of a batch of execution execID, once caller is found to own
// it, in one transaction: write gets the events' indexes in stack-name order (stackOf; each
// stack's own events keep their order), so that two batches naming the same stacks lock their
// rows in the same order and never deadlock. A single event goes as cheaply as the store allows
// (one statement without a transaction of its own where it can). It answers with the
// execution's state, and notifies when some event changed something.
func (s *Service) writeEvents(ctx context.Context, caller Caller, execID string, n int, stackOf func(i int) string,
	write func(tx store.Tx, order []int) (state store.EventState, changed bool, err error)) (api.Ack, error) {
	if err := s.checkOwner(ctx, caller, execID); err != nil {
		return api.Ack{}, err
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(stackOf(a), stackOf(b)) })
	run := s.Store.Write
	if n == 1 {
		run = s.writeOne
	}
	var ack api.Ack
	err := run(ctx, func(tx store.Tx) error {
		state, changed, err := write(tx, order)
		if err != nil {
			return err
		}
		ack = cancelAck(state.Cancelled, state.CancelReason)
		if !changed {
			return nil
		}
		return tx.Notify(execID)
	})
	if err == nil {
		s.noteSeen(ctx, execID)
	}
	return ack, err
}

// updateStack validates one update and returns the stack state it writes (updated at now).
func updateStack(in *api.Update, now time.Time) (*store.Stack, error) {
	if err := checkName("execution_id", in.ExecutionID); err != nil {
		return nil, err
	}
	if err := checkStack("stack", in.Stack); err != nil {
		return nil, err
	}
	if err := checkTime("at", in.At); err != nil {
		return nil, err
	}
	if !in.Status.Valid() {
		return nil, invalid("status %q is not a stack status", in.Status)
	}
	if in.Class != "" && !in.Class.Valid() {
		return nil, invalid("class %q is not a change class", in.Class)
	}
	if err := checkShort("plan_hash", in.PlanHash); err != nil {
		return nil, err
	}
	destructive := in.Destructive
	if len(destructive) > MaxDestructive {
		destructive = destructive[:MaxDestructive]
	}
	for _, addr := range destructive {
		if err := checkText("destructive address", addr, MaxNameLen); err != nil {
			return nil, err
		}
	}
	st := &store.Stack{Seq: in.Seq}
	st.StackState.Stack, st.Status, st.Class, st.Counts, st.PlanHash = in.Stack, in.Status, in.Class, in.Counts, in.PlanHash
	st.Destructive, st.Error, st.UpdatedAt = destructive, clip(in.Error, MaxTextLen), now
	return st, nil
}
