package sqlstore

// A runner event's statements: stack updates and phase events, guarded by the execution row.

import (
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// A runner event's writes are guarded: a stack keeps the fields of its newest seq, and nothing
// changes once the execution is finalized. Each event first takes the execution row in share
// mode. With WritableCTE the whole event is one statement, WITH e AS (the locked execution)
// INSERT ... SELECT ... FROM e, which needs no explicit transaction (see DB.WriteOne).

const eventStateSQL = "SELECT cancelled, cancel_reason, finalized FROM executions WHERE id = ?"

const (
	stackUpdateInsert   = "INSERT INTO stacks (execution_id, stack, status, class, counts, plan_hash, destructive, error, seq, updated_at) "
	stackUpdateConflict = " ON CONFLICT (execution_id, stack) DO UPDATE SET status = excluded.status, class = excluded.class, " +
		"counts = excluded.counts, plan_hash = excluded.plan_hash, destructive = excluded.destructive, error = excluded.error, " +
		"seq = excluded.seq, updated_at = excluded.updated_at WHERE stacks.seq <= excluded.seq"
	phaseInsert        = "INSERT INTO phases (execution_id, stack, phase, seq, status, message, at) "
	phaseConflict      = " ON CONFLICT (execution_id, stack, phase, seq) DO NOTHING"
	stackPhaseInsert   = "INSERT INTO stacks (execution_id, stack, status, phase, phase_seq, updated_at) "
	stackPhaseConflict = " ON CONFLICT (execution_id, stack) DO UPDATE SET phase = excluded.phase, phase_seq = excluded.phase_seq, " +
		"updated_at = excluded.updated_at, status = CASE WHEN stacks.status = ? THEN excluded.status ELSE stacks.status END " +
		"WHERE stacks.phase_seq <= excluded.phase_seq"
)

var (
	stackUpdateTypes = []string{"TEXT", "TEXT", "TEXT", "TEXT", "TEXT", "TEXT", "TEXT", "TEXT", "BIGINT", "BIGINT"}
	phaseTypes       = []string{"TEXT", "TEXT", "TEXT", "BIGINT", "TEXT", "TEXT", "BIGINT"}
	stackPhaseTypes  = []string{"TEXT", "TEXT", "TEXT", "TEXT", "BIGINT", "BIGINT"}
)

// values is the row of an INSERT of n parameters.
func values(n int) string { return "VALUES (?" + strings.Repeat(",?", n-1) + ")" }

// fromEvent is the row of an INSERT inside an event statement: its parameters, typed, selected
// from the locked execution e (so no row when the execution does not exist), filtered by where.
func fromEvent(types []string, where string) string {
	var b strings.Builder
	b.WriteString("SELECT ")
	for i, typ := range types {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("CAST(? AS " + typ + ")")
	}
	b.WriteString(" FROM e" + where)
	return b.String()
}

// eventSQL is the statement of eventStatement, with lock (forShare) after the execution's read.
func eventSQL(lock, ctes string, counted []string) string {
	q := "WITH e AS (" + eventStateSQL + lock + "), " + ctes + " SELECT e.cancelled, e.cancel_reason, e.finalized"
	for _, c := range counted {
		q += ", (SELECT COUNT(*) FROM " + c + ")"
	}
	return q + " FROM e"
}

// eventStatement runs WITH e AS (execID's state, share-locked), ctes SELECT (state, the row
// count of each of the counted CTEs) with args after execID, and returns what it selected.
func (t *sqlTx) eventStatement(execID, ctes string, counted []string, args ...any) (store.EventState, []int64, error) {
	var st store.EventState
	var cancelled, finalized int64
	counts := make([]int64, len(counted))
	dest := []any{&cancelled, &st.CancelReason, &finalized}
	for i := range counts {
		dest = append(dest, &counts[i])
	}
	err := t.row(eventSQL(t.forShare(), ctes, counted), append([]any{execID}, args...)...).Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return st, counts, fmt.Errorf("%w: execution %q", store.ErrNotFound, execID)
	}
	st.Cancelled, st.Finalized = cancelled != 0, finalized != 0
	return st, counts, t.s.mapErr(err)
}

// The CTEs of the one-statement ApplyUpdate and AddPhaseEvent (see eventStatement).
var (
	applyUpdateCTEs = "w AS (" + stackUpdateInsert + fromEvent(stackUpdateTypes, " WHERE e.finalized = 0") + stackUpdateConflict + " RETURNING 1)"
	addPhaseCTEs    = "p AS (" + phaseInsert + fromEvent(phaseTypes, "") + phaseConflict + " RETURNING 1), " +
		"w AS (" + stackPhaseInsert + fromEvent(stackPhaseTypes, " WHERE e.finalized = 0 AND EXISTS (SELECT 1 FROM p)") + stackPhaseConflict + " RETURNING 1)"
)

func (t *sqlTx) ApplyUpdate(execID string, s *store.Stack) (store.EventState, bool, error) {
	args := []any{execID, s.StackState.Stack, string(s.Status), string(s.Class), toJSON(s.Counts), s.PlanHash,
		toJSON(s.Destructive), s.Error, s.Seq, ns(s.UpdatedAt)}
	if t.s.d.WritableCTE {
		st, n, err := t.eventStatement(execID, applyUpdateCTEs, []string{"w"}, args...)
		return st, n[0] > 0, err
	}
	st, err := t.eventState(execID, t.forShare())
	if err != nil || st.Finalized {
		return st, false, err
	}
	n, err := t.exec(stackUpdateInsert+values(len(args))+stackUpdateConflict, args...)
	return st, n > 0, err
}

func (t *sqlTx) AddPhaseEvent(p store.Phase, shown string, now time.Time) (store.EventState, bool, error) {
	phase := []any{p.ExecutionID, p.Stack, p.Phase, p.Seq, p.Status, p.Message, ns(p.At)}
	stack := []any{p.ExecutionID, p.Stack, string(api.StackStatusRunning), shown, p.Seq, ns(now)}
	pending := string(api.StackStatusPending)
	if t.s.d.WritableCTE {
		args := append(append(phase, stack...), pending)
		st, n, err := t.eventStatement(p.ExecutionID, addPhaseCTEs, []string{"p"}, args...)
		return st, n[0] > 0, err
	}
	st, err := t.eventState(p.ExecutionID, t.forShare())
	if err != nil {
		return st, false, err
	}
	n, err := t.exec(phaseInsert+values(len(phase))+phaseConflict, phase...)
	if err != nil || n == 0 || st.Finalized {
		return st, n > 0, err
	}
	_, err = t.exec(stackPhaseInsert+values(len(stack))+stackPhaseConflict, append(stack, pending)...)
	return st, true, err
}

// ApplyUpdates is ApplyUpdate for each stack update of ss in turn (all of execution execID), in
// a few statements whatever their number: the execution's state is read (and share-locked)
// once, and each stack gets one upsert, from its winning update (the highest seq, the later of
// equal ones), which leaves the row as the updates one by one would have. applied is how many
// stacks were written.
func (t *sqlTx) ApplyUpdates(execID string, ss []*store.Stack) (store.EventState, int64, error) {
	st, err := t.eventState(execID, t.forShare())
	if err != nil || st.Finalized || len(ss) == 0 {
		return st, 0, err
	}
	winner := map[string]*store.Stack{}
	for _, s := range ss {
		if w, ok := winner[s.StackState.Stack]; !ok || w.Seq <= s.Seq {
			winner[s.StackState.Stack] = s
		}
	}
	// In stack-name order, the order every batch locks stack rows in.
	stacks := slices.Sorted(maps.Keys(winner))
	var applied int64
	err = inParts(len(stacks), len(stackUpdateTypes), func(from, to int, values string) error {
		args := make([]any, 0, len(stackUpdateTypes)*(to-from))
		for _, name := range stacks[from:to] {
			s := winner[name]
			args = append(args, execID, name, string(s.Status), string(s.Class), toJSON(s.Counts), s.PlanHash,
				toJSON(s.Destructive), s.Error, s.Seq, ns(s.UpdatedAt))
		}
		n, err := t.exec(stackUpdateInsert+values+stackUpdateConflict, args...)
		applied += n
		return err
	})
	return st, applied, err
}

// AddPhaseEvents is AddPhaseEvent for each event of ps in turn (all of execution execID),
// in a few statements whatever their number: the execution's state is read (and share-locked)
// once, the history rows go in multi-row inserts that return which were new, and each stack
// gets one upsert, from its winning new event (the highest seq, the later of equal ones), which
// leaves the row as the events one by one would have.
func (t *sqlTx) AddPhaseEvents(execID string, ps []store.Phase, shown []string, now time.Time) (store.EventState, int, error) {
	st, err := t.eventState(execID, t.forShare())
	if err != nil || len(ps) == 0 {
		return st, 0, err
	}
	type key struct {
		stack, phase string
		seq          int64
	}
	inserted := map[key]bool{}
	err = inParts(len(ps), len(phaseTypes), func(from, to int, values string) error {
		args := make([]any, 0, len(phaseTypes)*(to-from))
		for _, p := range ps[from:to] {
			args = append(args, execID, p.Stack, p.Phase, p.Seq, p.Status, p.Message, ns(p.At))
		}
		rows, err := t.query(phaseInsert+values+phaseConflict+" RETURNING stack, phase, seq", args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k key
			if err := rows.Scan(&k.stack, &k.phase, &k.seq); err != nil {
				return t.s.mapErr(err)
			}
			inserted[k] = true
		}
		return t.s.mapErr(rows.Err())
	})
	if err != nil {
		return st, 0, err
	}
	// An event is new when its row was inserted and no earlier event of the batch has its key.
	added := 0
	winner := map[string]int{}
	for i, p := range ps {
		k := key{p.Stack, p.Phase, p.Seq}
		if !inserted[k] {
			continue
		}
		delete(inserted, k)
		added++
		if w, ok := winner[p.Stack]; !ok || ps[w].Seq <= p.Seq {
			winner[p.Stack] = i
		}
	}
	if st.Finalized || len(winner) == 0 {
		return st, added, nil
	}
	// In stack-name order, the order every batch locks stack rows in.
	stacks := slices.Sorted(maps.Keys(winner))
	err = inParts(len(stacks), len(stackPhaseTypes), func(from, to int, values string) error {
		args := make([]any, 0, len(stackPhaseTypes)*(to-from)+1)
		for _, stack := range stacks[from:to] {
			i := winner[stack]
			args = append(args, execID, stack, string(api.StackStatusRunning), shown[i], ps[i].Seq, ns(now))
		}
		args = append(args, string(api.StackStatusPending))
		_, err := t.exec(stackPhaseInsert+values+stackPhaseConflict, args...)
		return err
	})
	return st, added, err
}

func (t *sqlTx) AddPhase(p store.Phase) (bool, error) {
	n, err := t.exec(phaseInsert+values(7)+phaseConflict, p.ExecutionID, p.Stack, p.Phase, p.Seq, p.Status, p.Message, ns(p.At))
	return n > 0, err
}
