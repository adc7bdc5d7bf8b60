-- scope --
-- Transaction-local (the third argument): gone at COMMIT, so a pooled connection carries
-- nothing into the next transaction. A transaction that may be lost in a crash without harm
-- (a claim: models.jobs.leases says why) commits without waiting for its WAL flush; CASE
-- evaluates set_config only then, so every other transaction keeps the server's own setting
-- (which may be stronger than 'on', e.g. remote_apply).
-- The lease (a worker's tenant transaction of a job it holds) is set only when given: the
-- worker's row-level security reads it through lease_org().
SELECT set_config('app.organization_id', :org, true) AS organization_id,
       set_config('app.user_id', :user, true) AS user_id,
       set_config('app.actor', :actor, true) AS actor,
       CASE WHEN NOT :durable THEN set_config('synchronous_commit', 'off', true) END AS commit,
       CASE WHEN :lease THEN set_config('app.job_id', :job, true) END AS job_id,
       CASE WHEN :lease THEN set_config('app.lease_token', :token, true) END AS lease_token

-- set_role_space_owner --
SET LOCAL ROLE space_owner

-- statement_timeout --
-- Behind a transaction-mode pooler only: a direct connection carries the timeout in its startup
-- options, which PgBouncer refuses; transaction-local, so it never outlives this transaction on
-- a server connection that other clients share.
SELECT set_config('statement_timeout', :ms, true)
