-- The ids of the executions retention (`serve --retain`) deleted: an id is never announced
-- again, so that whatever a replica remembers of an execution (its owner, cached for good) never
-- applies to another one.
CREATE TABLE IF NOT EXISTS pruned_executions (
  id TEXT PRIMARY KEY,
  pruned_at BIGINT NOT NULL
);
