package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// sqlTx implements store.Tx over one *sql.Tx.
type sqlTx struct {
	s      *DB
	ctx    context.Context
	tx     *sql.Tx
	db     *sql.DB
	notify []string
	// write marks a read-write transaction: its execution and stack reads lock the rows.
	write bool
	// ran marks that a WriteOne (tx nil) ran its one statement.
	ran bool
}

// execer runs statements: *sql.Tx, or *sql.DB in a WriteOne.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// target returns the transaction, or in a WriteOne the database for its one statement (which
// is then a transaction of its own).
func (t *sqlTx) target() execer {
	if t.tx != nil {
		return t.tx
	}
	if t.ran {
		panic("sqlstore: a WriteOne ran more than one statement")
	}
	t.ran = true
	return t.db
}

// forUpdate is the row-lock suffix of a read inside this transaction.
func (t *sqlTx) forUpdate() string {
	if t.write {
		return t.s.d.ForUpdate
	}
	return ""
}

// forShare is the shared row-lock suffix of a read inside this transaction.
func (t *sqlTx) forShare() string {
	if t.write {
		return t.s.d.ForShare
	}
	return ""
}

// stmt returns the cached prepared statement for query bound to this write transaction, or nil
// (run the query text) when the dialect does not cache statements or it is not prepared yet.
func (t *sqlTx) stmt(query string) (*sql.Stmt, error) {
	if !t.s.d.Prepare || t.db != t.s.wdb || t.tx == nil {
		return nil, nil
	}
	st := t.s.prepared(t.s.q(query))
	if st == nil {
		return nil, nil
	}
	return t.tx.StmtContext(t.ctx, st), nil
}

func ns(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func tm(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func toJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return "null"
	}
	return string(b)
}

func fromJSON(s string, v any) {
	// Most stacks have no destructive addresses and no reasons: an empty list decodes to what
	// v already is (nothing, read as empty), without the decoder (an execution's page reads
	// 10,000 stacks).
	if s != "" && s != "[]" && s != "{}" {
		_ = json.Unmarshal([]byte(s), v)
	}
}

// traced hands a statement to the store's tracer, when a test set one.
func (t *sqlTx) traced(query string, args []any) {
	if f := t.s.trace; f != nil {
		f(t.s.q(query), args)
	}
}

func (t *sqlTx) exec(query string, args ...any) (int64, error) {
	t.traced(query, args)
	var res sql.Result
	st, err := t.stmt(query)
	switch {
	case err != nil:
	case st != nil:
		res, err = st.ExecContext(t.ctx, args...)
	default:
		res, err = t.target().ExecContext(t.ctx, t.s.q(query), args...)
	}
	if err != nil {
		return 0, t.s.mapErr(err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}

func (t *sqlTx) query(query string, args ...any) (*sql.Rows, error) {
	t.traced(query, args)
	var rows *sql.Rows
	st, err := t.stmt(query)
	switch {
	case err != nil:
	case st != nil:
		rows, err = st.QueryContext(t.ctx, args...)
	default:
		rows, err = t.target().QueryContext(t.ctx, t.s.q(query), args...)
	}
	if err != nil {
		return nil, t.s.mapErr(err)
	}
	return rows, nil
}

func (t *sqlTx) row(query string, args ...any) *sql.Row {
	t.traced(query, args)
	if st, err := t.stmt(query); err == nil && st != nil {
		return st.QueryRowContext(t.ctx, args...)
	}
	return t.target().QueryRowContext(t.ctx, t.s.q(query), args...)
}

// Notify records that the execution changed; delivered after commit.
func (t *sqlTx) Notify(execID string) error {
	for _, id := range t.notify {
		if id == execID {
			return nil
		}
	}
	t.notify = append(t.notify, execID)
	return nil
}

// LockEnvironment takes a transaction-scoped lock keyed by the repository and environment.
func (t *sqlTx) LockEnvironment(repo, env string) error {
	if t.s.d.LockSQL == "" {
		return nil
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte("env:" + repo + "\x00" + env))
	_, err := t.exec(t.s.d.LockSQL, int64(h.Sum64()>>1))
	return err
}

// execReadCols are the columns every read of an execution selects: all but its edges, which
// can number tens of thousands and only the execution's detail shows (ExecutionEdges).
const execReadCols = "id, repo, pr, sha, base, environment, op, actor, run_url, status, class, counts, cancelled, cancel_reason, edges_approximate, error, finalized, started_at, finished_at"

// execCols are the columns CreateExecution writes: execReadCols, then the edges.
const execCols = execReadCols + ", edges"

// scanExecution reads a row of execReadCols; the execution's Edges stay nil.
func scanExecution(sc interface{ Scan(...any) error }) (*store.Execution, error) {
	var e store.Execution
	var counts, op, status, class string
	var cancelled, approx, finalized, started, finished int64
	if err := sc.Scan(&e.ExecutionID, &e.Repo, &e.PR, &e.SHA, &e.Base, &e.Environment, &op, &e.Actor,
		&e.RunURL, &status, &class, &counts, &cancelled, &e.CancelReason, &approx, &e.Error,
		&finalized, &started, &finished); err != nil {
		return nil, err
	}
	e.Op = api.ExecutionOp(op)
	e.Status = api.ExecutionStatus(status)
	e.Class = api.Class(class)
	fromJSON(counts, &e.Counts)
	e.Cancelled = cancelled != 0
	e.EdgesApproximate = approx != 0
	e.Finalized = finalized != 0
	e.StartedAt = tm(started)
	e.FinishedAt = tm(finished)
	return &e, nil
}

func (t *sqlTx) CreateExecution(e *store.Execution) (bool, error) {
	n, err := t.exec("INSERT INTO executions ("+execCols+") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT (id) DO NOTHING",
		e.ExecutionID, e.Repo, e.PR, e.SHA, e.Base, e.Environment, string(e.Op), e.Actor, e.RunURL,
		string(e.Status), string(e.Class), toJSON(e.Counts), b2i(e.Cancelled), e.CancelReason,
		b2i(e.EdgesApproximate), e.Error, b2i(e.Finalized), ns(e.StartedAt), ns(e.FinishedAt), toJSON(e.Edges))
	return n > 0, err
}

func (t *sqlTx) Execution(id string) (*store.Execution, error) {
	e, err := scanExecution(t.row("SELECT "+execReadCols+" FROM executions WHERE id = ?"+t.forUpdate(), id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: execution %q", store.ErrNotFound, id)
	}
	return e, t.s.mapErr(err)
}

func (t *sqlTx) ExecutionEdges(id string) ([]api.Edge, error) {
	var edges string
	err := t.row("SELECT edges FROM executions WHERE id = ?", id).Scan(&edges)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: execution %q", store.ErrNotFound, id)
	}
	if err != nil {
		return nil, t.s.mapErr(err)
	}
	var out []api.Edge
	fromJSON(edges, &out)
	return out, nil
}

func (t *sqlTx) ExecutionCancel(id string) (bool, string, error) {
	var cancelled int64
	var reason string
	err := t.row("SELECT cancelled, cancel_reason FROM executions WHERE id = ?", id).Scan(&cancelled, &reason)
	if errors.Is(err, sql.ErrNoRows) {
		return false, "", fmt.Errorf("%w: execution %q", store.ErrNotFound, id)
	}
	return cancelled != 0, reason, t.s.mapErr(err)
}

func (t *sqlTx) EventState(id string) (store.EventState, error) {
	return t.eventState(id, t.forUpdate())
}

func (t *sqlTx) eventState(id, lock string) (store.EventState, error) {
	var cancelled, finalized int64
	var st store.EventState
	err := t.row(eventStateSQL+lock, id).Scan(&cancelled, &st.CancelReason, &finalized)
	if errors.Is(err, sql.ErrNoRows) {
		return st, fmt.Errorf("%w: execution %q", store.ErrNotFound, id)
	}
	st.Cancelled, st.Finalized = cancelled != 0, finalized != 0
	return st, t.s.mapErr(err)
}

func (t *sqlTx) SaveExecution(e *store.Execution) error {
	n, err := t.exec("UPDATE executions SET status = ?, class = ?, counts = ?, cancelled = ?, cancel_reason = ?, error = ?, finalized = ?, finished_at = ? WHERE id = ?",
		string(e.Status), string(e.Class), toJSON(e.Counts), b2i(e.Cancelled), e.CancelReason, e.Error,
		b2i(e.Finalized), ns(e.FinishedAt), e.ExecutionID)
	if err == nil && n == 0 {
		return fmt.Errorf("%w: execution %q", store.ErrNotFound, e.ExecutionID)
	}
	return err
}

func (t *sqlTx) scanExecutions(query string, args ...any) ([]store.Execution, error) {
	rows, err := t.query(query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Execution
	for rows.Next() {
		e, err := scanExecution(rows)
		if err != nil {
			return nil, t.s.mapErr(err)
		}
		out = append(out, *e)
	}
	return out, t.s.mapErr(rows.Err())
}

func (t *sqlTx) Executions(f store.ExecutionFilter) ([]store.Execution, error) {
	var w whereClause
	w.eq(f.Repo != "", "repo", f.Repo)
	w.eq(f.Environment != "", "environment", f.Environment)
	w.eq(f.PR != 0, "pr", f.PR)
	// (started_at, id) < (?, ?), a range of the index that holds the filter's executions by
	// (started_at, id): executions_started and those by repository, environment, PR or some of
	// them (004, 007).
	var after []any
	switch {
	case f.BeforeID != "":
		after = []any{ns(f.Before), f.BeforeID}
	case !f.Before.IsZero():
		w.conds = append(w.conds, "started_at < ?")
		w.args = append(w.args, ns(f.Before))
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 50
	}
	tail, targs := w.page([]string{"started_at", "id"}, after, limit)
	return t.scanExecutions("SELECT "+execReadCols+" FROM executions"+w.String()+tail, append(w.args, targs...)...)
}

const stackCols = "stack, status, phase, phase_seq, class, counts, plan_hash, destructive, reasons, error, seq, updated_at"

func scanStack(sc interface{ Scan(...any) error }) (*store.Stack, error) {
	var s store.Stack
	var status, class, counts, destructive, reasons string
	var updated int64
	if err := sc.Scan(&s.StackState.Stack, &status, &s.Phase, &s.PhaseSeq, &class, &counts, &s.PlanHash,
		&destructive, &reasons, &s.Error, &s.Seq, &updated); err != nil {
		return nil, err
	}
	s.Status = api.StackStatus(status)
	s.Class = api.Class(class)
	fromJSON(counts, &s.Counts)
	fromJSON(destructive, &s.Destructive)
	fromJSON(reasons, &s.Reasons)
	s.UpdatedAt = tm(updated)
	return &s, nil
}

func (t *sqlTx) Stacks(execID string) ([]store.Stack, error) {
	rows, err := t.query("SELECT "+stackCols+" FROM stacks WHERE execution_id = ? ORDER BY stack", execID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Stack
	for rows.Next() {
		s, err := scanStack(rows)
		if err != nil {
			return nil, t.s.mapErr(err)
		}
		out = append(out, *s)
	}
	return out, t.s.mapErr(rows.Err())
}

func (t *sqlTx) PlanHashes(execIDs []string) (map[string]map[string]string, error) {
	ids := slices.Compact(slices.Sorted(slices.Values(execIDs)))
	out := map[string]map[string]string{}
	err := inLists(ids, func(list string, args []any) error {
		rows, err := t.query("SELECT execution_id, stack, plan_hash FROM stacks WHERE execution_id IN "+list, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id, stack, hash string
			if err := rows.Scan(&id, &stack, &hash); err != nil {
				return t.s.mapErr(err)
			}
			if out[id] == nil {
				out[id] = map[string]string{}
			}
			out[id][stack] = hash
		}
		return t.s.mapErr(rows.Err())
	})
	return out, err
}

func (t *sqlTx) Stack(execID, stack string) (*store.Stack, error) {
	s, err := scanStack(t.row("SELECT "+stackCols+" FROM stacks WHERE execution_id = ? AND stack = ?"+t.forUpdate(), execID, stack))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: stack %q in execution %q", store.ErrNotFound, stack, execID)
	}
	return s, t.s.mapErr(err)
}

func (t *sqlTx) SaveStack(execID string, s *store.Stack) error {
	_, err := t.exec("INSERT INTO stacks (execution_id, "+stackCols+") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?) "+
		"ON CONFLICT (execution_id, stack) DO UPDATE SET status = excluded.status, phase = excluded.phase, "+
		"phase_seq = excluded.phase_seq, class = excluded.class, counts = excluded.counts, plan_hash = excluded.plan_hash, "+
		"destructive = excluded.destructive, reasons = excluded.reasons, error = excluded.error, seq = excluded.seq, "+
		"updated_at = excluded.updated_at",
		execID, s.StackState.Stack, string(s.Status), s.Phase, s.PhaseSeq, string(s.Class), toJSON(s.Counts), s.PlanHash,
		toJSON(s.Destructive), toJSON(s.Reasons), s.Error, s.Seq, ns(s.UpdatedAt))
	return err
}

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

func (t *sqlTx) AddLogBatch(execID string, cs []store.LogChunk) (store.EventState, []string, int64, error) {
	cs, err := normalizeBatch(cs)
	if err != nil {
		return store.EventState{}, nil, 0, err
	}
	if t.s.d.WritableCTE {
		st, missing, added, overlaps, err := t.addLogBatchCTE(execID, cs)
		if err != nil || len(missing) > 0 || !overlaps {
			return st, missing, added, err
		}
		if t.tx == nil {
			return st, nil, 0, errNeedsTransaction
		}
		added, err = t.addChecked(execID, cs)
		return st, nil, added, err
	}
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = c.Stack
	}
	st, missing, err := t.logTarget(execID, names)
	if err != nil || len(missing) > 0 {
		return st, missing, 0, err
	}
	overlaps, err := t.logOverlaps(execID, cs)
	if err != nil {
		return st, nil, 0, err
	}
	var added int64
	if overlaps {
		added, err = t.addChecked(execID, cs)
	} else {
		added, err = t.addRuns(cs)
	}
	return st, nil, added, err
}

// addRuns stores the chunks cs (sorted by stack, generation and offset) as the rows of joinRuns,
// each row once, and returns how many of cs the rows it inserted hold.
func (t *sqlTx) addRuns(cs []store.LogChunk) (int64, error) {
	rows, counts := joinRuns(cs)
	type key struct {
		stack      string
		generation int64
		off        int64
	}
	count := make(map[key]int64, len(rows))
	for i, r := range rows {
		count[key{r.Stack, r.Generation, r.Offset}] = counts[i]
	}
	var added int64
	err := inParts(len(rows), 7, func(from, to int, values string) error {
		args := make([]any, 0, 7*(to-from))
		for _, c := range rows[from:to] {
			args = append(args, chunkArgs(c)...)
		}
		res, err := t.query(chunkInsert+values+chunkConflict+" RETURNING stack, generation, off", args...)
		if err != nil {
			return err
		}
		defer res.Close()
		for res.Next() {
			var k key
			if err := res.Scan(&k.stack, &k.generation, &k.off); err != nil {
				return t.s.mapErr(err)
			}
			added += count[k]
		}
		return t.s.mapErr(res.Err())
	})
	return added, err
}

// logOverlaps reports whether some chunk of cs (normalized) may overlap the stored log
// (overlapProbeSQL over probeSpans), in a statement per maxRowsPerInsert spans.
func (t *sqlTx) logOverlaps(execID string, cs []store.LogChunk) (bool, error) {
	found := false
	stacks, gens, offs, lens := probeSpans(cs)
	err := inParts(len(stacks), 4, func(from, to int, values string) error {
		if found {
			return nil
		}
		args := make([]any, 0, 4*(to-from)+1)
		for i := from; i < to; i++ {
			args = append(args, stacks[i], gens[i], offs[i], lens[i])
		}
		args = append(args, execID)
		rows, err := t.query("WITH c (stack, generation, off, n) AS ("+values+") SELECT 1 FROM c WHERE "+overlapProbeSQL+" LIMIT 1", args...)
		if err != nil {
			return err
		}
		found = rows.Next()
		rows.Close()
		return t.s.mapErr(rows.Err())
	})
	return found, err
}

// logBatchSQL is the statement of addLogBatchCTE: the execution's state (e), the chunks (c, one
// array a column), the stacks the execution lacks (m), whether some chunk may overlap the stored
// log (o), and the insert (w), which stores nothing when m or o has a row.
const logBatchSQL = "WITH e AS (" + eventStateSQL + "), " +
	"c AS (SELECT * FROM unnest(CAST(? AS TEXT[]), CAST(? AS BIGINT[]), CAST(? AS BIGINT[]), CAST(? AS BYTEA[]), CAST(? AS BIGINT[]), CAST(? AS BIGINT[]), CAST(? AS BIGINT[])) " +
	"AS c (stack, generation, off, data, n, gap_length, k)), " +
	"m AS (SELECT DISTINCT c.stack FROM c WHERE NOT EXISTS (SELECT 1 FROM stacks s WHERE s.execution_id = ? AND s.stack = c.stack)), " +
	"o AS (SELECT 1 FROM unnest(CAST(? AS TEXT[]), CAST(? AS BIGINT[]), CAST(? AS BIGINT[]), CAST(? AS BIGINT[])) AS c (stack, generation, off, n) " +
	"WHERE " + overlapProbeSQL + " LIMIT 1), " +
	"w AS (INSERT INTO log_chunks (execution_id, stack, generation, off, data, n, gap_length) " +
	"SELECT CAST(? AS TEXT), c.stack, c.generation, c.off, c.data, c.n, c.gap_length FROM c, e WHERE NOT EXISTS (SELECT 1 FROM m) AND NOT EXISTS (SELECT 1 FROM o)" +
	chunkConflict + " RETURNING stack, generation, off) " +
	"SELECT e.cancelled, e.cancel_reason, e.finalized, (SELECT COALESCE(SUM(c.k), 0) FROM w JOIN c USING (stack, generation, off)), " +
	"(SELECT json_agg(stack ORDER BY stack) FROM m), (SELECT COUNT(*) FROM o) FROM e"

// addLogBatchCTE is AddLogBatch in one statement: the chunks travel as one array a column. It
// stores nothing, and reports overlaps, when some chunk may overlap the stored log
// (overlapProbeSQL over probeSpans).
func (t *sqlTx) addLogBatchCTE(execID string, cs []store.LogChunk) (store.EventState, []string, int64, bool, error) {
	rows, counts := joinRuns(cs)
	n := len(rows)
	stacks, data := make([]string, n), make([][]byte, n)
	gens, offs, sizes, gaps := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, c := range rows {
		a := chunkArgs(c)
		stacks[i], gens[i], offs[i], data[i], sizes[i], gaps[i] = c.Stack, c.Generation, c.Offset, a[4].([]byte), a[5].(int64), c.GapLength
	}
	pStacks, pGens, pOffs, pLens := probeSpans(cs)
	var st store.EventState
	var cancelled, finalized, added, overlaps int64
	var missingJSON sql.NullString
	err := t.row(logBatchSQL,
		execID, stacks, gens, offs, data, sizes, gaps, counts, execID, pStacks, pGens, pOffs, pLens, execID, execID).Scan(&cancelled, &st.CancelReason, &finalized, &added, &missingJSON, &overlaps)
	if errors.Is(err, sql.ErrNoRows) {
		return st, nil, 0, false, fmt.Errorf("%w: execution %q", store.ErrNotFound, execID)
	}
	if err != nil {
		return st, nil, 0, false, t.s.mapErr(err)
	}
	st.Cancelled, st.Finalized = cancelled != 0, finalized != 0
	var missing []string
	if missingJSON.Valid {
		if err := json.Unmarshal([]byte(missingJSON.String), &missing); err != nil {
			return st, nil, 0, false, fmt.Errorf("%w: missing stacks %q: %v", store.ErrUnavailable, missingJSON.String, err)
		}
	}
	return st, missing, added, overlaps > 0, nil
}

// maxNamesPerQuery bounds the IN list of one logTarget query; shorter lists are padded to a
// power of two so that only a few distinct statements are prepared.
const maxNamesPerQuery = 64

// logTarget returns execID's state, read without locking, and the names among stacks (sorted,
// once each) it has no stack of, or ErrNotFound.
func (t *sqlTx) logTarget(execID string, stacks []string) (store.EventState, []string, error) {
	var st store.EventState
	want := append([]string(nil), stacks...)
	sort.Strings(want)
	want = slices.Compact(want)
	known := make(map[string]bool, len(want))
	rest := want
	for first := true; first || len(rest) > 0; first = false {
		k := min(len(rest), maxNamesPerQuery)
		size := 1
		for size < k {
			size *= 2
		}
		args := make([]any, 0, size+1)
		for i := range size {
			name := ""
			if k > 0 {
				name = rest[min(i, k-1)]
			}
			args = append(args, name)
		}
		args = append(args, execID)
		rows, err := t.query("SELECT e.cancelled, e.cancel_reason, e.finalized, s.stack FROM executions e "+
			"LEFT JOIN stacks s ON s.execution_id = e.id AND s.stack IN (?"+strings.Repeat(",?", size-1)+") WHERE e.id = ?", args...)
		if err != nil {
			return st, nil, err
		}
		found := false
		for rows.Next() {
			var cancelled, finalized int64
			var name sql.NullString
			if err := rows.Scan(&cancelled, &st.CancelReason, &finalized, &name); err != nil {
				rows.Close()
				return st, nil, t.s.mapErr(err)
			}
			found = true
			st.Cancelled, st.Finalized = cancelled != 0, finalized != 0
			if name.Valid {
				known[name.String] = true
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return st, nil, t.s.mapErr(err)
		}
		if !found {
			return st, nil, fmt.Errorf("%w: execution %q", store.ErrNotFound, execID)
		}
		rest = rest[k:]
	}
	var missing []string
	for _, name := range want {
		if !known[name] {
			missing = append(missing, name)
		}
	}
	return st, missing, nil
}

func (t *sqlTx) AddPhase(p store.Phase) (bool, error) {
	n, err := t.exec(phaseInsert+values(7)+phaseConflict, p.ExecutionID, p.Stack, p.Phase, p.Seq, p.Status, p.Message, ns(p.At))
	return n > 0, err
}

func chunkArgs(c store.LogChunk) []any {
	size := int64(len(c.Data))
	if c.GapLength > 0 {
		size = c.GapLength
	}
	data := c.Data
	if data == nil {
		data = []byte{}
	}
	return []any{c.ExecutionID, c.Stack, c.Generation, c.Offset, data, size, c.GapLength}
}

const chunkInsert = "INSERT INTO log_chunks (execution_id, stack, generation, off, data, n, gap_length) "
const chunkConflict = " ON CONFLICT (execution_id, stack, generation, off) DO NOTHING"

func (t *sqlTx) AddLogChunk(c store.LogChunk) (bool, error) {
	n, err := t.exec(chunkInsert+values(7)+chunkConflict, chunkArgs(c)...)
	return n > 0, err
}

// maxRowsPerInsert keeps multi-row inserts to a few distinct (cacheable) statements.
const maxRowsPerInsert = 64

// inParts calls fn for consecutive parts [from, to) of n rows, at most maxRowsPerInsert each,
// with the VALUES clause of the part's rows of params parameters each.
func inParts(n, params int, fn func(from, to int, values string) error) error {
	row := "(?" + strings.Repeat(",?", params-1) + ")"
	for from := 0; from < n; from += maxRowsPerInsert {
		to := min(from+maxRowsPerInsert, n)
		if err := fn(from, to, "VALUES "+strings.Repeat(row+",", to-from-1)+row); err != nil {
			return err
		}
	}
	return nil
}

func (t *sqlTx) AddLogChunks(cs []store.LogChunk) (int64, error) {
	var added int64
	err := inParts(len(cs), 7, func(from, to int, values string) error {
		args := make([]any, 0, 7*(to-from))
		for _, c := range cs[from:to] {
			args = append(args, chunkArgs(c)...)
		}
		n, err := t.exec(chunkInsert+values+chunkConflict, args...)
		added += n
		return err
	})
	return added, err
}

// chunkEndSQL is the offset just past a log_chunks row c, saturating at its two arguments
// (math.MaxInt64): rows stored before offsets were bounded may reach past int64, and neither
// backend may compute c.off + c.n then (PostgreSQL fails, SQLite turns it into a float).
const chunkEndSQL = "CASE WHEN c.off < 0 OR c.n < 0 THEN c.off WHEN c.n > ? - c.off THEN ? ELSE c.off + c.n END"

// addSat is a + b for b >= 0, saturating at math.MaxInt64.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// logExtentSQL lists where the chunks of one generation around an offset start and how far they
// reach, from the covering index log_chunks_extent alone (no data is read): the chunk that starts
// last before the offset, then at most a given number of those that start at it or later.
const logExtentSQL = "SELECT off, n, gap_length FROM (SELECT off, n, gap_length FROM log_chunks " +
	"WHERE execution_id = ? AND stack = ? AND generation = ? AND off >= 0 AND off < ? ORDER BY off DESC LIMIT 1) p " +
	"UNION ALL SELECT off, n, gap_length FROM (SELECT off, n, gap_length FROM log_chunks " +
	"WHERE execution_id = ? AND stack = ? AND generation = ? AND off >= ? ORDER BY off LIMIT ?) f"

// logExtentAfterSQL is logExtentSQL for the chunks that start after an offset.
const logExtentAfterSQL = "SELECT off, n, gap_length FROM log_chunks WHERE execution_id = ? AND stack = ? AND generation = ? AND off > ? ORDER BY off LIMIT ?"

// logDataSQL reads the data of the chunks of one generation starting in [from, to].
const logDataSQL = "SELECT off, data FROM log_chunks WHERE execution_id = ? AND stack = ? AND generation = ? AND off >= ? AND off <= ? ORDER BY off"

func (t *sqlTx) LogChunks(execID, stack string, generation, from int64, maxBytes, maxRows int) ([]store.LogChunk, error) {
	from = max(from, 0)
	return t.logChunks(execID, stack, generation, from, maxBytes, maxRows,
		logExtentSQL, execID, stack, generation, from, execID, stack, generation, from, max(maxRows, 1))
}

func (t *sqlTx) LogChunksAfter(execID, stack string, generation, after int64, maxBytes, maxRows int) ([]store.LogChunk, error) {
	if after == math.MaxInt64 {
		return nil, nil
	}
	after = max(after, -1)
	return t.logChunks(execID, stack, generation, after+1, maxBytes, maxRows,
		logExtentAfterSQL, execID, stack, generation, after, max(maxRows, 1))
}

// logChunks reads the extents the query selects and keeps, in offset order, those that reach past
// from (a chunk starting before from only when it does), up to maxBytes of data or maxRows chunks;
// then it reads the data of the data chunks kept, and of no other.
func (t *sqlTx) logChunks(execID, stack string, generation, from int64, maxBytes, maxRows int, query string, args ...any) ([]store.LogChunk, error) {
	maxRows = max(maxRows, 1)
	rows, err := t.query(query, args...)
	if err != nil {
		return nil, err
	}
	type extent struct{ off, n, gap int64 }
	var ext []extent
	for rows.Next() {
		var e extent
		if err := rows.Scan(&e.off, &e.n, &e.gap); err != nil {
			rows.Close()
			return nil, t.s.mapErr(err)
		}
		ext = append(ext, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, t.s.mapErr(err)
	}
	slices.SortFunc(ext, func(a, b extent) int { return cmp.Compare(a.off, b.off) })
	var out []store.LogChunk
	total := 0
	first, last := int64(-1), int64(-1) // the data chunks kept
	for _, e := range ext {
		if len(out) >= maxRows || total >= maxBytes {
			break
		}
		if e.off < from && e.n <= from-e.off { // off + n may be past math.MaxInt64 (rows stored before offsets were bounded)
			continue
		}
		out = append(out, store.LogChunk{ExecutionID: execID, Stack: stack, Generation: generation, Offset: e.off, GapLength: e.gap})
		if e.gap <= 0 {
			total += int(min(max(e.n, 0), math.MaxInt32))
			if first < 0 {
				first = e.off
			}
			last = e.off
		}
	}
	if first < 0 {
		return out, nil
	}
	data, err := t.query(logDataSQL, execID, stack, generation, first, last)
	if err != nil {
		return nil, err
	}
	defer data.Close()
	byOff := make(map[int64][]byte, len(out))
	for data.Next() {
		var off int64
		var b []byte
		if err := data.Scan(&off, &b); err != nil {
			return nil, t.s.mapErr(err)
		}
		byOff[off] = b
	}
	if err := data.Err(); err != nil {
		return nil, t.s.mapErr(err)
	}
	// A chunk that went between the two reads (pruned: each statement of a PostgreSQL read may see
	// newer commits) ends the chunks here, as a hole would.
	for i := range out {
		if out[i].GapLength > 0 {
			continue
		}
		b, ok := byOff[out[i].Offset]
		if !ok {
			return out[:i], nil
		}
		out[i].Data = b
	}
	return out, nil
}

func (t *sqlTx) LatestGeneration(execID, stack string) (int64, error) {
	var g sql.NullInt64
	err := t.row("SELECT MAX(generation) FROM log_chunks WHERE execution_id = ? AND stack = ?", execID, stack).Scan(&g)
	return g.Int64, t.s.mapErr(err)
}

// logStacksSQL walks the stacks an execution has logs of, one index seek each (a loose index scan:
// GROUP BY would read every chunk), with the latest generation of each.
const logStacksSQL = "WITH RECURSIVE s(stack) AS (SELECT MIN(stack) FROM log_chunks WHERE execution_id = ? " +
	"UNION ALL SELECT (SELECT MIN(c.stack) FROM log_chunks c WHERE c.execution_id = ? AND c.stack > s.stack) FROM s WHERE s.stack IS NOT NULL), " +
	"g AS (SELECT s.stack, (SELECT MAX(c.generation) FROM log_chunks c WHERE c.execution_id = ? AND c.stack = s.stack) AS generation " +
	"FROM s WHERE s.stack IS NOT NULL) "

// logSummarySQL is each stack's latest generation, where its last chunk ends (one seek of the
// covering index, where the greatest end of every chunk would read them all) and its first gap
// records up to a given number ("offset,length" separated by spaces), read from the gap index.
const logSummarySQL = logStacksSQL + "SELECT g.stack, g.generation, (SELECT " + chunkEndSQL + " FROM log_chunks c " +
	"WHERE c.execution_id = ? AND c.stack = g.stack AND c.generation = g.generation ORDER BY c.off DESC LIMIT 1), " +
	"(SELECT string_agg(CAST(x.off AS TEXT) || ',' || CAST(x.gap_length AS TEXT), ' ') FROM (SELECT c.off, c.gap_length FROM log_chunks c " +
	"WHERE c.execution_id = ? AND c.stack = g.stack AND c.generation = g.generation AND c.gap_length > 0 ORDER BY c.off LIMIT ?) x) FROM g"

func (t *sqlTx) LogSummaries(execID string, maxGaps int) ([]store.LogSummary, error) {
	maxGaps = max(maxGaps, 0)
	rows, err := t.query(logSummarySQL, execID, execID, execID, int64(math.MaxInt64), int64(math.MaxInt64), execID, execID, maxGaps+1)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.LogSummary
	for rows.Next() {
		var s store.LogSummary
		var gaps sql.NullString
		if err := rows.Scan(&s.Stack, &s.Generation, &s.Bytes, &gaps); err != nil {
			return nil, t.s.mapErr(err)
		}
		for _, g := range strings.Fields(gaps.String) {
			off, length, _ := strings.Cut(g, ",")
			from, err1 := strconv.ParseInt(off, 10, 64)
			n, err2 := strconv.ParseInt(length, 10, 64)
			if err := cmp.Or(err1, err2); err != nil {
				return nil, fmt.Errorf("%w: gap %q of stack %q: %v", store.ErrUnavailable, g, s.Stack, err)
			}
			s.Gaps = append(s.Gaps, api.LogGap{Generation: s.Generation, From: from, To: addSat(from, n)})
		}
		slices.SortFunc(s.Gaps, func(a, b api.LogGap) int { return cmp.Compare(a.From, b.From) })
		if len(s.Gaps) > maxGaps {
			s.Gaps, s.GapsTruncated = s.Gaps[:maxGaps], true
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, t.s.mapErr(err)
	}
	slices.SortFunc(out, func(a, b store.LogSummary) int { return strings.Compare(a.Stack, b.Stack) })
	return out, nil
}

func (t *sqlTx) StackSpans(execID string, stacks []string) (map[string]store.Span, error) {
	out := map[string]store.Span{}
	read := func(where string, args ...any) error {
		rows, err := t.query("SELECT stack, MIN(at), MAX(at) FROM phases WHERE execution_id = ? AND at > 0"+where+" GROUP BY stack", args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var stack string
			var first, last int64
			if err := rows.Scan(&stack, &first, &last); err != nil {
				return t.s.mapErr(err)
			}
			out[stack] = store.Span{First: tm(first), Last: tm(last)}
		}
		return t.s.mapErr(rows.Err())
	}
	if stacks == nil {
		return out, read("", execID)
	}
	return out, inLists(slices.Compact(slices.Sorted(slices.Values(stacks))), func(list string, args []any) error {
		return read(" AND stack IN "+list, append([]any{execID}, args...)...)
	})
}
