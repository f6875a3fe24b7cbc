-- Indexes the list queries read in the order they return, so a page costs its own rows rather
-- than a sort of every matching one.
--
-- Executions newest first (ORDER BY started_at DESC, id DESC), unfiltered or by environment,
-- PR, or both; (started_at, id) replaces (started_at), its prefix.
DROP INDEX IF EXISTS executions_started;
CREATE INDEX IF NOT EXISTS executions_started ON executions (started_at, id);
CREATE INDEX IF NOT EXISTS executions_env_started ON executions (environment, started_at, id);
CREATE INDEX IF NOT EXISTS executions_env_pr_started ON executions (environment, pr, started_at, id);
CREATE INDEX IF NOT EXISTS executions_pr_started ON executions (pr, started_at, id);

-- The claims a PR holds in an environment: a plan's finalize frees and keeps them; the primary
-- key (environment, stack) finds those on named stacks.
CREATE INDEX IF NOT EXISTS claims_env_pr ON claims (environment, pr, stack);

-- The claims one execution took, which its runner releases.
CREATE INDEX IF NOT EXISTS claims_env_exec ON claims (environment, execution_id);
