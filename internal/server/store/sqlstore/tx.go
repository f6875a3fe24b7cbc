package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
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
	var pruned int
	switch err := t.row("SELECT 1 FROM pruned_executions WHERE id = ?", e.ExecutionID).Scan(&pruned); {
	case err == nil:
		return false, fmt.Errorf("%w: execution id %q was used by an execution retention deleted; ids are never reused, choose another", store.ErrPrecondition, e.ExecutionID)
	case !errors.Is(err, sql.ErrNoRows):
		return false, t.s.mapErr(err)
	}
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
