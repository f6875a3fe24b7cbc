-- Gate integrity: plans ordered by when the server received them, approvals bound to a plan's
-- content, leases bound to the principal that took them and to the grants they used, and the
-- granter's binding tracked until it is removed.
ALTER TABLE executions ADD COLUMN received_at BIGINT NOT NULL DEFAULT 0;
UPDATE executions SET received_at = started_at;
ALTER TABLE executions ADD COLUMN principal TEXT NOT NULL DEFAULT '';
CREATE INDEX executions_env_pr_received ON executions (environment, pr, op, received_at);

ALTER TABLE grants ADD COLUMN execution_id TEXT NOT NULL DEFAULT '';
ALTER TABLE grants ADD COLUMN stacks TEXT NOT NULL DEFAULT '[]';

ALTER TABLE leases ADD COLUMN principal TEXT NOT NULL DEFAULT '';
ALTER TABLE leases ADD COLUMN sha TEXT NOT NULL DEFAULT '';
ALTER TABLE leases ADD COLUMN plan_id TEXT NOT NULL DEFAULT '';
ALTER TABLE leases ADD COLUMN grant_ids TEXT NOT NULL DEFAULT '[]';
ALTER TABLE leases ADD COLUMN member TEXT NOT NULL DEFAULT '';
ALTER TABLE leases ADD COLUMN bound BIGINT NOT NULL DEFAULT 0;
ALTER TABLE leases ADD COLUMN unbind_attempts BIGINT NOT NULL DEFAULT 0;
ALTER TABLE leases ADD COLUMN unbind_error TEXT NOT NULL DEFAULT '';
CREATE INDEX leases_bound ON leases (bound, expires_at);
