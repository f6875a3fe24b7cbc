package sqlstore

import (
	"strings"
	"time"
)

// Retention and quotas: pruning finished executions (serve --retain) and counting a principal's
// executions (the executions-per-hour quota).

// prunableSQL selects finished executions received (by the server's clock, not the runner's
// started_at) and finished before a time (the first two arguments) that nothing live needs at
// another (the next four), oldest first, up to a number.
const prunableSQL = "SELECT e.id FROM executions e WHERE e.received_at < ? AND e.finished_at < ? " +
	"AND (e.finalized = 1 OR e.status <> 'running') " +
	"AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.environment = e.environment AND c.execution_id = e.id AND (c.expires_at = 0 OR c.expires_at > ?)) " +
	"AND NOT EXISTS (SELECT 1 FROM gates g WHERE g.repo = e.repo AND g.environment = e.environment AND g.pr = e.pr AND g.execution_id = e.id) " +
	"AND NOT EXISTS (SELECT 1 FROM grants r WHERE r.environment = e.environment AND r.pr = e.pr AND r.execution_id = e.id " +
	"AND r.released_at = 0 AND (r.expires_at = 0 OR r.expires_at > ?)) " +
	"AND NOT EXISTS (SELECT 1 FROM leases l WHERE (l.execution_id = e.id OR l.plan_id = e.id) AND (l.bound <> 0 OR (l.revoked_at = 0 AND l.expires_at > ?))) " +
	"AND (e.op <> 'plan' OR EXISTS (SELECT 1 FROM executions n WHERE n.repo = e.repo AND n.environment = e.environment AND n.pr = e.pr " +
	"AND n.op = 'plan' AND (n.received_at > e.received_at OR (n.received_at = e.received_at AND n.id > e.id)))) " +
	"ORDER BY e.received_at LIMIT ?"

// prunedTables are the tables whose rows of a pruned execution go with it (the execution last).
// A stack's latest drift check (drift_latest) stays: it is the last word on its stack.
var prunedTables = []string{"log_chunks", "phases", "stacks", "execution_seen", "claims", "leases", "drift_checks", "executions"}

func (t *sqlTx) PruneExecutions(before, now time.Time, limit int) (int64, error) {
	rows, err := t.query(prunableSQL, ns(before), ns(before), ns(now), ns(now), ns(now), max(limit, 1))
	if err != nil {
		return 0, err
	}
	var ids []any
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, t.s.mapErr(err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(ids) == 0 {
		return 0, t.s.mapErr(err)
	}
	in := "(?" + strings.Repeat(",?", len(ids)-1) + ")"
	tomb := make([]any, 0, 2*len(ids))
	for _, id := range ids {
		tomb = append(tomb, id, ns(now))
	}
	if _, err := t.exec("INSERT INTO pruned_executions (id, pruned_at) VALUES (?,?)"+strings.Repeat(",(?,?)", len(ids)-1)+
		" ON CONFLICT (id) DO NOTHING", tomb...); err != nil {
		return 0, err
	}
	var n int64
	for _, table := range prunedTables {
		col := "execution_id"
		if table == "executions" {
			col = "id"
		}
		if n, err = t.exec("DELETE FROM "+table+" WHERE "+col+" IN "+in, ids...); err != nil {
			return 0, err
		}
	}
	return n, nil
}

func (t *sqlTx) ExecutionsSince(principal string, since time.Time, limit int) (int, time.Time, error) {
	var n int
	var first *int64
	err := t.row("SELECT COUNT(*), MIN(received_at) FROM (SELECT received_at FROM executions WHERE principal = ? AND received_at >= ? "+
		"ORDER BY received_at LIMIT ?) x", principal, ns(since), max(limit, 1)).Scan(&n, &first)
	if err != nil || first == nil {
		return n, time.Time{}, t.s.mapErr(err)
	}
	return n, tm(*first), nil
}

func (t *sqlTx) RepoExecutionsSince(repo, prefix string, since time.Time, limit int) (int, time.Time, error) {
	var n int
	var first *int64
	escaped := strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`).Replace(prefix)
	err := t.row("SELECT COUNT(*), MIN(received_at) FROM (SELECT received_at FROM executions WHERE repo = ? AND received_at >= ? "+
		`AND principal LIKE ? ESCAPE '\' ORDER BY received_at LIMIT ?) x`, repo, ns(since), escaped+"%", max(limit, 1)).Scan(&n, &first)
	if err != nil || first == nil {
		return n, time.Time{}, t.s.mapErr(err)
	}
	return n, tm(*first), nil
}

func (t *sqlTx) LogBytes(execID string) (int64, error) {
	var n int64
	err := t.row("SELECT COALESCE(SUM(n), 0) FROM log_chunks WHERE execution_id = ? AND gap_length = 0", execID).Scan(&n)
	return n, t.s.mapErr(err)
}
