-- The repository is part of every key: two repositories sharing one server never share a pull
-- request. Executions always had a repo column; it is stored lowercased (owner/name, as GitHub
-- compares it). Claims, gates and checks are keyed by it (their tables are rebuilt, the one way
-- to change a primary key that SQLite and PostgreSQL share); grants, leases and audit entries
-- carry it. A row takes the repository of the execution it came from; a row whose execution
-- named none (or is gone) keeps '' and is listed, but no request names it again: its claims
-- expire by their time, its grants by theirs.
UPDATE executions SET repo = lower(repo);

CREATE TABLE claims_007 (
  repo TEXT NOT NULL DEFAULT '',
  environment TEXT NOT NULL,
  stack TEXT NOT NULL,
  pr BIGINT NOT NULL,
  execution_id TEXT NOT NULL DEFAULT '',
  sha TEXT NOT NULL DEFAULT '',
  claimed_at BIGINT NOT NULL DEFAULT 0,
  expires_at BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (repo, environment, stack)
);
INSERT INTO claims_007 (repo, environment, stack, pr, execution_id, sha, claimed_at, expires_at)
  SELECT COALESCE((SELECT e.repo FROM executions e WHERE e.id = claims.execution_id), ''),
         environment, stack, pr, execution_id, sha, claimed_at, expires_at
  FROM claims;
DROP TABLE claims;
ALTER TABLE claims_007 RENAME TO claims;
-- A PR's claims in an environment (a plan's finalize frees and keeps them); the primary key finds
-- those on named stacks.
CREATE INDEX claims_repo_env_pr ON claims (repo, environment, pr, stack);
-- The claims one execution took, which its runner releases.
CREATE INDEX claims_env_exec ON claims (environment, execution_id);

CREATE TABLE gates_007 (
  repo TEXT NOT NULL DEFAULT '',
  environment TEXT NOT NULL,
  pr BIGINT NOT NULL,
  execution_id TEXT NOT NULL DEFAULT '',
  class TEXT NOT NULL,
  target TEXT NOT NULL,
  stacks TEXT NOT NULL DEFAULT '[]',
  required_at BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (repo, environment, pr, class, target)
);
INSERT INTO gates_007 (repo, environment, pr, execution_id, class, target, stacks, required_at)
  SELECT COALESCE((SELECT e.repo FROM executions e WHERE e.id = gates.execution_id), ''),
         environment, pr, execution_id, class, target, stacks, required_at
  FROM gates;
DROP TABLE gates;
ALTER TABLE gates_007 RENAME TO gates;

-- A check belongs to the repository of the PR's latest execution in the environment.
CREATE TABLE checks_007 (
  repo TEXT NOT NULL DEFAULT '',
  environment TEXT NOT NULL,
  pr BIGINT NOT NULL,
  name TEXT NOT NULL,
  conclusion TEXT NOT NULL,
  overridden BIGINT NOT NULL DEFAULT 0,
  reason TEXT NOT NULL DEFAULT '',
  updated_at BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (repo, environment, pr, name)
);
INSERT INTO checks_007 (repo, environment, pr, name, conclusion, overridden, reason, updated_at)
  SELECT COALESCE((SELECT e.repo FROM executions e WHERE e.environment = checks.environment AND e.pr = checks.pr
                   ORDER BY e.received_at DESC, e.id DESC LIMIT 1), ''),
         environment, pr, name, conclusion, overridden, reason, updated_at
  FROM checks;
DROP TABLE checks;
ALTER TABLE checks_007 RENAME TO checks;

ALTER TABLE grants ADD COLUMN repo TEXT NOT NULL DEFAULT '';
UPDATE grants SET repo = COALESCE((SELECT e.repo FROM executions e WHERE e.id = grants.execution_id), '');
ALTER TABLE leases ADD COLUMN repo TEXT NOT NULL DEFAULT '';
UPDATE leases SET repo = COALESCE((SELECT e.repo FROM executions e WHERE e.id = leases.plan_id),
                                  (SELECT e.repo FROM executions e WHERE e.id = leases.execution_id), '');
ALTER TABLE audit ADD COLUMN repo TEXT NOT NULL DEFAULT '';

-- The latest plan of a PR, by arrival, now within its repository.
DROP INDEX IF EXISTS executions_env_pr_received;
CREATE INDEX executions_repo_env_pr_received ON executions (repo, environment, pr, op, received_at);

-- The lists' indexes (004, 006) hold each list's rows in the order it pages them, for every
-- filter it takes: the filter's columns (repository, environment, PR) first, then the list's
-- order (a time or an id, then the rest of its key). A PR is named with its repository (a PR
-- number alone means nothing once repositories share the server), so the indexes of a PR filter
-- without one go. The gates' and checks' were dropped with their tables.
DROP INDEX IF EXISTS executions_pr_started;
DROP INDEX IF EXISTS executions_env_pr_started;
DROP INDEX IF EXISTS grants_pr_id;
DROP INDEX IF EXISTS grants_env_pr_id;
CREATE INDEX executions_repo_started ON executions (repo, started_at, id);
CREATE INDEX executions_repo_env_started ON executions (repo, environment, started_at, id);
CREATE INDEX executions_repo_env_pr_started ON executions (repo, environment, pr, started_at, id);
CREATE INDEX executions_repo_pr_started ON executions (repo, pr, started_at, id);

CREATE INDEX gates_required ON gates (required_at, repo, environment, pr, class, target);
CREATE INDEX gates_env_required ON gates (environment, required_at, repo, pr, class, target);
CREATE INDEX gates_repo_required ON gates (repo, required_at, environment, pr, class, target);
CREATE INDEX gates_repo_env_required ON gates (repo, environment, required_at, pr, class, target);
CREATE INDEX gates_repo_env_pr_required ON gates (repo, environment, pr, required_at, class, target);
CREATE INDEX gates_repo_pr_required ON gates (repo, pr, required_at, environment, class, target);

CREATE INDEX checks_updated ON checks (updated_at, repo, environment, pr, name);
CREATE INDEX checks_env_updated ON checks (environment, updated_at, repo, pr, name);
CREATE INDEX checks_repo_updated ON checks (repo, updated_at, environment, pr, name);
CREATE INDEX checks_repo_env_updated ON checks (repo, environment, updated_at, pr, name);
CREATE INDEX checks_repo_env_pr_updated ON checks (repo, environment, pr, updated_at, name);
CREATE INDEX checks_repo_pr_updated ON checks (repo, pr, updated_at, environment, name);

-- Gate decisions read a PR's active grants of one gate (class and target) or of all its gates.
DROP INDEX IF EXISTS grants_key;
CREATE INDEX grants_repo_key ON grants (repo, environment, pr, class, target);
CREATE INDEX grants_repo_id ON grants (repo, id);
CREATE INDEX grants_repo_env_id ON grants (repo, environment, id);
CREATE INDEX grants_repo_env_pr_id ON grants (repo, environment, pr, id);
CREATE INDEX grants_repo_pr_id ON grants (repo, pr, id);

CREATE INDEX audit_repo_id ON audit (repo, id);
