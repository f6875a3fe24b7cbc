package sqlstore

import (
	"time"
)

// Liveness: when the server last heard from each execution's runner (execution_seen, 031).

func (t *sqlTx) SeeExecution(id string, at time.Time) error {
	_, err := t.exec("INSERT INTO execution_seen (execution_id, seen_at) VALUES (?, ?) "+
		"ON CONFLICT (execution_id) DO UPDATE SET seen_at = excluded.seen_at WHERE execution_seen.seen_at < excluded.seen_at", id, ns(at))
	return err
}

func (t *sqlTx) StaleExecutions(before time.Time, limit int) ([]string, error) {
	rows, err := t.query("SELECT e.id FROM executions e LEFT JOIN execution_seen s ON s.execution_id = e.id "+
		"WHERE e.finalized = 0 AND e.cancelled = 0 AND e.status = 'running' AND e.received_at < ? AND COALESCE(s.seen_at, 0) < ? "+
		"ORDER BY e.received_at, e.id LIMIT ?", ns(before), ns(before), max(limit, 1))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, t.s.mapErr(err)
		}
		out = append(out, id)
	}
	return out, t.s.mapErr(rows.Err())
}
