-- Drift checks: what each drift execution (op drift, a scheduled plan of every stack) found of
-- each stack. drift_checks is the history, one row per stack and execution; drift_latest holds
-- each stack's latest check, so that an environment's drift page reads one row per stack
-- however long the history. Retention prunes the history with its executions; the latest check
-- stays, the last word on its stack until the next drift run.
CREATE TABLE IF NOT EXISTS drift_checks (
  repo TEXT NOT NULL,
  environment TEXT NOT NULL,
  stack TEXT NOT NULL,
  execution_id TEXT NOT NULL,
  checked_at BIGINT NOT NULL,
  status TEXT NOT NULL,
  drifted INTEGER NOT NULL DEFAULT 0,
  class TEXT NOT NULL DEFAULT '',
  counts TEXT NOT NULL DEFAULT '{}',
  PRIMARY KEY (repo, environment, stack, execution_id)
);
-- A stack's history, newest first.
CREATE INDEX IF NOT EXISTS drift_checks_stack_time ON drift_checks (repo, environment, stack, checked_at);
-- Retention (`serve --retain`) deletes an execution's checks with it.
CREATE INDEX IF NOT EXISTS drift_checks_execution ON drift_checks (execution_id);
CREATE TABLE IF NOT EXISTS drift_latest (
  repo TEXT NOT NULL,
  environment TEXT NOT NULL,
  stack TEXT NOT NULL,
  execution_id TEXT NOT NULL,
  checked_at BIGINT NOT NULL,
  status TEXT NOT NULL,
  drifted INTEGER NOT NULL DEFAULT 0,
  class TEXT NOT NULL DEFAULT '',
  counts TEXT NOT NULL DEFAULT '{}',
  PRIMARY KEY (repo, environment, stack)
);
