-- executions_env_pr (environment, pr, op, started_at) serves no query: the latest plan of a PR
-- reads executions_env_pr_received (002) and the executions list executions_env_pr_started
-- (004). It only cost a write on every Init.
DROP INDEX IF EXISTS executions_env_pr;
