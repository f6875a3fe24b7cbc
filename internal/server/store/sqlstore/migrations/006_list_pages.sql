-- Gates, grants and checks are listed a page at a time, newest first: grants by id, gates and
-- checks by a time and then their key (all descending), so that rows of the same time still
-- have one order. Each list gets the indexes executions got in 004, holding its rows in that
-- order unfiltered or by environment, PR, or both: a page, the first or a later one, costs its
-- own rows rather than a sort of every matching one.
--
-- Gates: required_at is when the server recorded them (a PR's plan finalized). The gates
-- recorded before this migration take the time their plan arrived.
ALTER TABLE gates ADD COLUMN required_at BIGINT NOT NULL DEFAULT 0;
UPDATE gates SET required_at = COALESCE((SELECT received_at FROM executions WHERE executions.id = gates.execution_id), 0);
CREATE INDEX IF NOT EXISTS gates_required ON gates (required_at, environment, pr, class, target);
CREATE INDEX IF NOT EXISTS gates_env_required ON gates (environment, required_at, pr, class, target);
CREATE INDEX IF NOT EXISTS gates_env_pr_required ON gates (environment, pr, required_at, class, target);
CREATE INDEX IF NOT EXISTS gates_pr_required ON gates (pr, required_at, environment, class, target);

-- Grants: the primary key orders the unfiltered list.
CREATE INDEX IF NOT EXISTS grants_env_id ON grants (environment, id);
CREATE INDEX IF NOT EXISTS grants_env_pr_id ON grants (environment, pr, id);
CREATE INDEX IF NOT EXISTS grants_pr_id ON grants (pr, id);

-- Checks: updated_at is when the check was last concluded (or overridden).
CREATE INDEX IF NOT EXISTS checks_updated ON checks (updated_at, environment, pr, name);
CREATE INDEX IF NOT EXISTS checks_env_updated ON checks (environment, updated_at, pr, name);
CREATE INDEX IF NOT EXISTS checks_env_pr_updated ON checks (environment, pr, updated_at, name);
CREATE INDEX IF NOT EXISTS checks_pr_updated ON checks (pr, updated_at, environment, name);
