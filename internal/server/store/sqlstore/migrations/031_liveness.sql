-- When the server last heard from each execution's runner, for `serve --stale-after`: a table of
-- its own, so that a heartbeat never locks the execution row the runner's events share.
CREATE TABLE IF NOT EXISTS execution_seen (
  execution_id TEXT PRIMARY KEY,
  seen_at BIGINT NOT NULL
);
-- The stale sweep reads only the executions not finalized yet, oldest first.
CREATE INDEX IF NOT EXISTS executions_unfinalized ON executions (received_at) WHERE finalized = 0;
-- Retention (`serve --retain`) keeps a plan a lease was granted over: looked up by plan.
CREATE INDEX IF NOT EXISTS leases_plan ON leases (plan_id);
-- The executions-per-hour quota counts a principal's newest executions.
CREATE INDEX IF NOT EXISTS executions_principal_received ON executions (principal, received_at);
