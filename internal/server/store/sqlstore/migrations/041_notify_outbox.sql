-- The notification outbox: one row per event and notify target, written in the transaction of
-- the change the event reports, sent by a delivery worker. A row stays pending (next_at: when
-- its next attempt is due, or until when a worker holds it) until a 2xx answers (delivered) or
-- it has been retried for a day (failed); retention (`serve --retain`) deletes the rows that
-- ended. The body is rendered when the event is written; the target's secret is never stored.
CREATE TABLE IF NOT EXISTS notify_outbox (
  id {{ID}},
  delivery TEXT NOT NULL UNIQUE,
  target TEXT NOT NULL,
  event TEXT NOT NULL,
  repo TEXT NOT NULL DEFAULT '',
  environment TEXT NOT NULL DEFAULT '',
  pr BIGINT NOT NULL DEFAULT 0,
  execution_id TEXT NOT NULL DEFAULT '',
  body TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'pending',
  attempts INTEGER NOT NULL DEFAULT 0,
  last_status INTEGER NOT NULL DEFAULT 0,
  last_error TEXT NOT NULL DEFAULT '',
  created_at BIGINT NOT NULL,
  next_at BIGINT NOT NULL,
  last_at BIGINT NOT NULL DEFAULT 0,
  delivered_at BIGINT NOT NULL DEFAULT 0
);
-- The worker takes the pending rows due first, in the order of this index (no sort of the outbox).
CREATE INDEX IF NOT EXISTS notify_outbox_due ON notify_outbox (status, next_at, id);
-- Retention takes the rows written first.
CREATE INDEX IF NOT EXISTS notify_outbox_created ON notify_outbox (created_at);
