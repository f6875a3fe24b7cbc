-- The ids of the executions retention (`serve --retain`) deleted: an id is never announced
-- again, so that whatever a replica remembers of an execution (its owner, cached for good) never
-- applies to another one.
CREATE TABLE IF NOT EXISTS pruned_executions (
  id TEXT PRIMARY KEY,
  pruned_at BIGINT NOT NULL
);
-- The executions-per-hour quota counts a repository's GitHub Actions jobs together (each run is
-- a principal of its own): their newest executions in the repository.
CREATE INDEX IF NOT EXISTS executions_repo_received ON executions (repo, received_at);
