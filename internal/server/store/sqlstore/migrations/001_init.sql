-- One schema for every backend. {{ID}} and {{BLOB}} are replaced per dialect.
CREATE TABLE executions (
  id TEXT PRIMARY KEY,
  repo TEXT NOT NULL DEFAULT '',
  pr BIGINT NOT NULL DEFAULT 0,
  sha TEXT NOT NULL DEFAULT '',
  base TEXT NOT NULL DEFAULT '',
  environment TEXT NOT NULL,
  op TEXT NOT NULL,
  actor TEXT NOT NULL DEFAULT '',
  run_url TEXT NOT NULL DEFAULT '',
  status TEXT NOT NULL,
  class TEXT NOT NULL DEFAULT '',
  counts TEXT NOT NULL DEFAULT '{}',
  cancelled BIGINT NOT NULL DEFAULT 0,
  cancel_reason TEXT NOT NULL DEFAULT '',
  edges TEXT NOT NULL DEFAULT '[]',
  edges_approximate BIGINT NOT NULL DEFAULT 0,
  error TEXT NOT NULL DEFAULT '',
  finalized BIGINT NOT NULL DEFAULT 0,
  started_at BIGINT NOT NULL DEFAULT 0,
  finished_at BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX executions_started ON executions (started_at);
CREATE INDEX executions_env_pr ON executions (environment, pr, op, started_at);

CREATE TABLE stacks (
  execution_id TEXT NOT NULL,
  stack TEXT NOT NULL,
  status TEXT NOT NULL,
  phase TEXT NOT NULL DEFAULT '',
  phase_seq BIGINT NOT NULL DEFAULT 0,
  class TEXT NOT NULL DEFAULT '',
  counts TEXT NOT NULL DEFAULT '{}',
  plan_hash TEXT NOT NULL DEFAULT '',
  destructive TEXT NOT NULL DEFAULT '[]',
  reasons TEXT NOT NULL DEFAULT '[]',
  error TEXT NOT NULL DEFAULT '',
  seq BIGINT NOT NULL DEFAULT 0,
  updated_at BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (execution_id, stack)
);

CREATE TABLE phases (
  execution_id TEXT NOT NULL,
  stack TEXT NOT NULL,
  phase TEXT NOT NULL,
  seq BIGINT NOT NULL,
  status TEXT NOT NULL DEFAULT '',
  message TEXT NOT NULL DEFAULT '',
  at BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (execution_id, stack, phase, seq)
);

CREATE TABLE log_chunks (
  execution_id TEXT NOT NULL,
  stack TEXT NOT NULL,
  generation BIGINT NOT NULL,
  off BIGINT NOT NULL,
  data {{BLOB}},
  n BIGINT NOT NULL,
  gap_length BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (execution_id, stack, generation, off)
);

CREATE TABLE claims (
  environment TEXT NOT NULL,
  stack TEXT NOT NULL,
  pr BIGINT NOT NULL,
  execution_id TEXT NOT NULL DEFAULT '',
  sha TEXT NOT NULL DEFAULT '',
  claimed_at BIGINT NOT NULL DEFAULT 0,
  expires_at BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (environment, stack)
);

CREATE TABLE gates (
  environment TEXT NOT NULL,
  pr BIGINT NOT NULL,
  execution_id TEXT NOT NULL DEFAULT '',
  class TEXT NOT NULL,
  target TEXT NOT NULL,
  stacks TEXT NOT NULL DEFAULT '[]',
  PRIMARY KEY (environment, pr, class, target)
);

CREATE TABLE grants (
  id {{ID}},
  environment TEXT NOT NULL,
  pr BIGINT NOT NULL,
  class TEXT NOT NULL,
  target TEXT NOT NULL,
  principal TEXT NOT NULL DEFAULT '',
  reason TEXT NOT NULL DEFAULT '',
  granted_at BIGINT NOT NULL DEFAULT 0,
  expires_at BIGINT NOT NULL DEFAULT 0,
  released_at BIGINT NOT NULL DEFAULT 0,
  released_by TEXT NOT NULL DEFAULT ''
);
CREATE INDEX grants_key ON grants (environment, pr, class, target);

CREATE TABLE leases (
  execution_id TEXT PRIMARY KEY,
  environment TEXT NOT NULL DEFAULT '',
  pr BIGINT NOT NULL DEFAULT 0,
  requester TEXT NOT NULL DEFAULT '',
  outcome TEXT NOT NULL DEFAULT '',
  granted_at BIGINT NOT NULL DEFAULT 0,
  expires_at BIGINT NOT NULL DEFAULT 0,
  revoked_at BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE checks (
  environment TEXT NOT NULL,
  pr BIGINT NOT NULL,
  name TEXT NOT NULL,
  conclusion TEXT NOT NULL,
  overridden BIGINT NOT NULL DEFAULT 0,
  reason TEXT NOT NULL DEFAULT '',
  updated_at BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (environment, pr, name)
);

CREATE TABLE audit (
  id {{ID}},
  at BIGINT NOT NULL,
  principal TEXT NOT NULL,
  action TEXT NOT NULL,
  target TEXT NOT NULL DEFAULT '',
  reason TEXT NOT NULL DEFAULT '',
  outcome TEXT NOT NULL DEFAULT '',
  detail TEXT NOT NULL DEFAULT ''
);
