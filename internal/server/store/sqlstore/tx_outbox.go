package sqlstore

import (
	"context"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// The notification outbox (store.OutboxTx, store.Outbox).

const outboxCols = "id, delivery, target, event, repo, environment, pr, execution_id, body, status, attempts, " +
	"last_status, last_error, created_at, next_at, last_at, delivered_at"

// Enqueue writes deliveries in the transaction.
func (t *sqlTx) Enqueue(ds []store.Delivery) error {
	for _, d := range ds {
		if _, err := t.exec("INSERT INTO notify_outbox (delivery, target, event, repo, environment, pr, execution_id, body, status, created_at, next_at) "+
			"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", d.Delivery, d.Target, d.Event, d.Repo, d.Environment, d.PR, d.ExecutionID,
			string(d.Body), store.DeliveryPending, ns(d.CreatedAt), ns(d.NextAt)); err != nil {
			return err
		}
	}
	return nil
}

// driftChangesSQL compares each stack's check of an execution, when it is the stack's latest,
// with the stack's previous successful check.
const driftChangesSQL = "SELECT c.stack, c.drifted, COALESCE((SELECT p.drifted FROM drift_checks p WHERE p.repo = c.repo " +
	"AND p.environment = c.environment AND p.stack = c.stack AND p.status = 'succeeded' AND p.execution_id <> c.execution_id " +
	"AND (p.checked_at < c.checked_at OR (p.checked_at = c.checked_at AND p.execution_id < c.execution_id)) " +
	"ORDER BY p.checked_at DESC, p.execution_id DESC LIMIT 1), 0) " +
	"FROM drift_checks c JOIN drift_latest l ON l.repo = c.repo AND l.environment = c.environment AND l.stack = c.stack " +
	"AND l.execution_id = c.execution_id WHERE c.execution_id = ? AND c.repo = ? AND c.environment = ? AND c.status = 'succeeded'"

// DriftChanges lists the stacks whose drifted flag execution execID changed.
func (t *sqlTx) DriftChanges(repo, env, execID string) (map[string]bool, error) {
	rows, err := t.query(driftChangesSQL, execID, repo, env)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var stack string
		var now, before int64
		if err := rows.Scan(&stack, &now, &before); err != nil {
			return nil, t.s.mapErr(err)
		}
		if (now != 0) != (before != 0) {
			out[stack] = now != 0
		}
	}
	return out, t.s.mapErr(rows.Err())
}

func (t *sqlTx) scanDeliveries(q string, args ...any) ([]store.Delivery, error) {
	rows, err := t.query(q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Delivery
	for rows.Next() {
		var d store.Delivery
		var body string
		var created, next, last, delivered int64
		if err := rows.Scan(&d.ID, &d.Delivery, &d.Target, &d.Event, &d.Repo, &d.Environment, &d.PR, &d.ExecutionID, &body,
			&d.Status, &d.Attempts, &d.LastStatus, &d.LastError, &created, &next, &last, &delivered); err != nil {
			return nil, t.s.mapErr(err)
		}
		d.Body = []byte(body)
		d.CreatedAt, d.NextAt, d.LastAt, d.DeliveredAt = tm(created), tm(next), tm(last), tm(delivered)
		out = append(out, d)
	}
	return out, t.s.mapErr(rows.Err())
}

// ClaimDeliveries takes due pending deliveries no one else holds: on PostgreSQL the rows another
// replica is taking are skipped (FOR UPDATE SKIP LOCKED), and the hold written into next_at keeps
// every worker off them until it ends, without a lock held while the request is out.
func (s *DB) ClaimDeliveries(ctx context.Context, now time.Time, hold time.Duration, limit int) ([]store.Delivery, error) {
	var out []store.Delivery
	until := now.Add(hold)
	err := s.Write(ctx, func(tx store.Tx) error {
		t := tx.(*sqlTx)
		q := "SELECT " + outboxCols + " FROM notify_outbox WHERE status = ? AND next_at <= ? ORDER BY next_at, id LIMIT ?"
		if s.d.ForUpdate != "" {
			q += s.d.ForUpdate + " SKIP LOCKED"
		}
		ds, err := t.scanDeliveries(q, store.DeliveryPending, ns(now), max(limit, 1))
		if err != nil || len(ds) == 0 {
			out = nil
			return err
		}
		ids := make([]any, 0, len(ds)+1)
		ids = append(ids, ns(until))
		for i := range ds {
			ids = append(ids, ds[i].ID)
			ds[i].NextAt = until
		}
		if _, err := t.exec("UPDATE notify_outbox SET next_at = ? WHERE id IN (?"+strings.Repeat(",?", len(ds)-1)+")", ids...); err != nil {
			return err
		}
		out = ds
		return nil
	})
	return out, err
}

// FinishDeliveries records attempts' results, each unless its hold was lost.
func (s *DB) FinishDeliveries(ctx context.Context, fs []store.Finished) ([]bool, error) {
	ok := make([]bool, len(fs))
	err := s.Write(ctx, func(tx store.Tx) error {
		for i, f := range fs {
			r := f.Result
			status, next, delivered := store.DeliveryPending, ns(r.Next), int64(0)
			switch {
			case r.Delivered:
				status, next, delivered = store.DeliveryDelivered, 0, ns(r.At)
			case r.Failed:
				status, next = store.DeliveryFailed, 0
			}
			n, err := tx.(*sqlTx).exec("UPDATE notify_outbox SET status = ?, attempts = attempts + 1, last_status = ?, last_error = ?, "+
				"last_at = ?, next_at = ?, delivered_at = ? WHERE id = ? AND status = ? AND next_at = ?",
				status, r.Status, r.Err, ns(r.At), next, delivered, f.ID, store.DeliveryPending, ns(f.HeldUntil))
			if err != nil {
				return err
			}
			ok[i] = n == 1
		}
		return nil
	})
	return ok, err
}

// Deliveries lists deliveries, newest first.
func (s *DB) Deliveries(ctx context.Context, f store.DeliveryFilter) ([]store.Delivery, error) {
	if f.Limit <= 0 {
		f.Limit = 50
	}
	var out []store.Delivery
	err := s.Read(ctx, func(tx store.Tx) error {
		q, args := "SELECT "+outboxCols+" FROM notify_outbox WHERE 1 = 1", []any{}
		if f.Status != "" {
			q, args = q+" AND status = ?", append(args, f.Status)
		}
		if f.Before > 0 {
			q, args = q+" AND id < ?", append(args, f.Before)
		}
		var err error
		out, err = tx.(*sqlTx).scanDeliveries(q+" ORDER BY id DESC LIMIT ?", append(args, f.Limit)...)
		return err
	})
	return out, err
}

// Redeliver makes a delivery pending again, due at now.
func (s *DB) Redeliver(ctx context.Context, id int64, now time.Time) error {
	return s.Write(ctx, func(tx store.Tx) error {
		// A pending delivery keeps its hold: a worker may be sending it right now.
		n, err := tx.(*sqlTx).exec("UPDATE notify_outbox SET status = ?, next_at = ?, delivered_at = 0 WHERE id = ? AND status <> ?",
			store.DeliveryPending, ns(now), id, store.DeliveryPending)
		if err != nil || n == 1 {
			return err
		}
		var c int
		if err := tx.(*sqlTx).row("SELECT COUNT(*) FROM notify_outbox WHERE id = ?", id).Scan(&c); err != nil {
			return s.mapErr(err)
		}
		if c == 0 {
			return store.ErrNotFound
		}
		return nil
	})
}

// PruneDeliveries deletes ended deliveries written before `before`.
func (s *DB) PruneDeliveries(ctx context.Context, before time.Time, limit int) (int64, error) {
	var n int64
	err := s.Write(ctx, func(tx store.Tx) error {
		var err error
		n, err = tx.(*sqlTx).exec("DELETE FROM notify_outbox WHERE id IN (SELECT id FROM notify_outbox WHERE created_at < ? "+
			"AND status <> ? ORDER BY created_at LIMIT ?)", ns(before), store.DeliveryPending, max(limit, 1))
		return err
	})
	return n, err
}

// OutboxStats counts deliveries by status and finds the oldest pending one.
func (s *DB) OutboxStats(ctx context.Context) (map[string]int64, time.Time, error) {
	counts := map[string]int64{}
	var oldest time.Time
	err := s.Read(ctx, func(tx store.Tx) error {
		t := tx.(*sqlTx)
		rows, err := t.query("SELECT status, COUNT(*) FROM notify_outbox GROUP BY status")
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var st string
			var n int64
			if err := rows.Scan(&st, &n); err != nil {
				return s.mapErr(err)
			}
			counts[st] = n
		}
		if err := rows.Err(); err != nil {
			return s.mapErr(err)
		}
		var first *int64
		if err := t.row("SELECT MIN(created_at) FROM notify_outbox WHERE status = ?", store.DeliveryPending).Scan(&first); err != nil {
			return s.mapErr(err)
		}
		if first != nil {
			oldest = tm(*first)
		}
		return nil
	})
	return counts, oldest, err
}

// NextDue returns when the earliest pending delivery is due.
func (s *DB) NextDue(ctx context.Context) (time.Time, error) {
	var due time.Time
	err := s.Read(ctx, func(tx store.Tx) error {
		var first *int64
		if err := tx.(*sqlTx).row("SELECT MIN(next_at) FROM notify_outbox WHERE status = ?", store.DeliveryPending).Scan(&first); err != nil {
			return s.mapErr(err)
		}
		if first != nil {
			due = tm(*first)
		}
		return nil
	})
	return due, err
}
