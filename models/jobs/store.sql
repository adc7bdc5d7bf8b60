-- The job store: every statement that changes jobs.status lives here and is called only from
-- models/jobs/store.py. The transition trigger (models/db/schema/40_job_transitions.sql) rejects
-- anything else; statement-level triggers write the job_events rows (and metric events) in the
-- same transaction.
--
-- Columns are listed, never `*`: a worker must not receive another tenant's result, and the
-- lease token leaves the database only towards the worker that holds the lease.

-- submit --
-- Every submit, one job or a batch, in one statement (see submit_jobs() in the schema): the
-- requester's standing checked (and held until commit), the batch admitted against the quotas
-- (a workflow with its steps), each row and its event written, or the answer for a debounce, a
-- replay, a duplicate, a full quota or a refusal. Any role's transaction will do; it need not
-- be scoped to the organization. The organization's cap is the database's; the kinds' declared
-- caps are ours to pass (:kind_quotas, and :quota_kinds with :quota_caps). Ids made by the
-- caller; each answer names its job's place in the request (request_place). Arguments by name:
-- their order is the function's business alone.
SELECT * FROM submit_jobs(
    p_organization_id => :organization_id, p_requested_by => :requested_by,
    p_org_states => CAST(:org_states AS text[]), p_role => :role, p_request_id => :request_id,
    p_ids => CAST(:ids AS uuid[]), p_kinds => CAST(:kinds AS text[]),
    p_params => CAST(:params AS jsonb[]), p_max_attempts => CAST(:max_attempts AS integer[]),
    p_lease_seconds => CAST(:lease_seconds AS integer[]),
    p_dedup_keys => CAST(:dedup_keys AS text[]),
    p_run_afters => CAST(:run_afters AS timestamptz[]),
    p_org_quota => NULL, p_kind_quotas => CAST(:kind_quotas AS integer[]),
    p_priorities => CAST(:priorities AS integer[]),
    p_traceparent => CAST(:traceparent AS text),
    p_sequence_keys => CAST(:sequence_keys AS text[]),
    p_quota_kinds => CAST(:quota_kinds AS text[]), p_quota_caps => CAST(:quota_caps AS integer[]),
    p_debounce_seconds => CAST(:debounce_seconds AS integer[]),
    p_idempotency_key => CAST(:idempotency_key AS text), p_retry_of => CAST(:retry_of AS uuid),
    p_bulk => CAST(:bulk AS boolean))

-- traceparents --
-- Worker role, only while tracing is on: the trace context each leased job was submitted in,
-- to parent its attempt's span (models/tracing.py). Never the claim's business: with tracing
-- off nothing reads it.
SELECT id, traceparent FROM jobs WHERE id = ANY (CAST(:ids AS uuid[])) AND traceparent IS NOT NULL

-- claim_batch --
-- Worker role. Up to :limit due jobs in ONE statement, each with its own fresh random lease
-- token, the organizations taken in turn from just after :after_organization (see claim_jobs()
-- in the schema: fair shares through jobs_fair_claim_idx, leases that ran out through
-- jobs_lease_expiry_idx, SKIP LOCKED so concurrent claimers pass each other). A function,
-- because it is the one place a worker reads a job's params: only its own leases'.
SELECT * FROM claim_jobs(:worker, :limit, CAST(:skip_kinds AS text[]), CAST(:only_kind AS text),
                         CAST(:after_organization AS uuid), CAST(:rate_kinds AS text[]),
                         CAST(:rate_max AS integer[]), CAST(:rate_seconds AS integer[]))

-- extend_leases --
-- Heartbeat, one statement for every lease a worker process holds (see extend_leases() in the
-- schema: a row missing from the answer is no longer ours).
SELECT id, status FROM extend_leases(CAST(:ids AS uuid[]), CAST(:tokens AS uuid[]))

-- record_progress --
SELECT record_progress(:id, :lease_token, CAST(:progress AS jsonb))

-- lease_status --
SELECT lease_status(:id, :lease_token)

-- complete_batch --
-- The fenced finish of many jobs in one statement (see complete_jobs() in the schema): a job
-- whose token no longer holds its lease is missing from the answer, and its result discarded.
SELECT id FROM complete_jobs(CAST(:ids AS uuid[]), CAST(:tokens AS uuid[]),
                             CAST(:results AS jsonb[]), CAST(:refs AS text[]))

-- lease_standing --
-- The requester's membership role and the organization's state for held jobs, locked until
-- commit (see lease_standing() in the schema).
SELECT job_id, role, organization_state
FROM lease_standing(CAST(:ids AS uuid[]), CAST(:tokens AS uuid[]))

-- fail_attempt --
-- One decision for every failed attempt, fenced like the finish (see fail_job() in the schema),
-- with the operators' diagnosis of an unexpected exception.
SELECT status, run_after
FROM fail_job(p_id => :id, p_token => :lease_token, p_permanent => :permanent,
              p_retry_in => :retry_in, p_error_code => :error_code,
              p_error_message => :error_message, p_worker => :worker,
              p_exception_class => :exception_class, p_traceback => :traceback)

-- acknowledge_cancel --
-- The running job saw cancel_requested at a safe point and stops.
SELECT acknowledge_cancel(:id, :lease_token)

-- release_batch --
-- Give jobs back untouched, attempt not burned, claimable at once: at graceful shutdown, and the
-- jobs a process holds unstarted behind a long one. The NOTIFY (one per transaction, however
-- many rows: PostgreSQL folds identical ones; none when nothing was given back) tells the pool
-- processes that linger on LISTEN at once, as an insert's does: a broker wake-up reaches only
-- an idle one.
SELECT released.id, pg_notify('spacejobs_jobs', '')
FROM release_jobs(CAST(:ids AS uuid[]), CAST(:tokens AS uuid[])) AS released

-- lock_for_cancel --
-- Web role, scoped to the organization, in the cancel's transaction before request_cancel: the
-- job's row, which whatever makes its children (start_fan_out(), start_workflow(), a child's
-- end through the jobs trigger) holds until they are committed, and the rows of its unfinished
-- tree below it, which the cancel stops with it. From the leaves up (lock_tree()): a child's
-- finish locks the child, then its parent (the jobs trigger), and the same order here keeps
-- the two from deadlocking.
SELECT lock_tree(:id)

-- request_cancel --
-- Web role, scoped to the organization. queued and waiting end at once; a running job is asked
-- to stop.
-- A parent's tree of jobs that have not ended is cancelled with it, the same way (the jobs
-- trigger, stop_children()).
-- The one rule for every cancel (the API, the pages, the Python API, the operators) is here,
-- where the row changes: an operator, when the caller says it acts as one and the user is one;
-- else a current member of a live organization who started the job or holds the role it needs
-- (job_role_needed(): its kind's, and for a parent the strictest of every kind it holds, so a
-- workflow is never easier to cancel than its steps; :kind_roles, the registry's kind -> role,
-- a kind it does not name needing an owner).
-- The same statement writes who asked to the organization's audit log (the actor says whether
-- a member or an operator did); asking again changes nothing and writes nothing.
WITH asked AS (
    UPDATE jobs j
    SET status = CASE WHEN j.status IN ('queued', 'waiting') THEN 'cancelled'
                      ELSE 'cancel_requested' END,
        cancel_requested_at = now(), cancel_requested_by = :user_id
    WHERE j.id = :id AND j.status IN ('queued', 'leased', 'waiting')
      AND (EXISTS (SELECT 1 FROM users u
                   WHERE u.id = :user_id AND u.is_operator AND CAST(:as_operator AS boolean))
           OR EXISTS (SELECT 1 FROM memberships m JOIN organizations o ON o.id = m.organization_id
                      WHERE m.organization_id = j.organization_id AND m.user_id = :user_id
                        AND o.state <> 'deleted'
                        AND (j.requested_by = :user_id
                             OR role_rank(m.role) >= role_rank(job_role_needed(
                                    j.id, CAST(:kind_roles AS jsonb))))))
    RETURNING id, organization_id, requested_by, kind, status, attempts, max_attempts, progress,
           error_code, error_message, dedup_key, run_after, created_at, updated_at, started_at,
           finished_at, cancel_requested_at, leased_by, lease_until, result_expired_at,
           wait_until, wait_signal, wait_children, sequence_key, parent_id, child_index AS place
), audited AS (
    INSERT INTO org_audit (organization_id, actor_id, actor, action, job_id, detail, request_id)
    SELECT organization_id, :user_id, coalesce(app_actor(), 'user:' || CAST(:user_id AS text)),
           'job.cancel', id, jsonb_build_object('kind', kind, 'status', status), :request_id
    FROM asked
)
SELECT * FROM asked

-- resumed_as --
-- Web role, scoped to the organization: the job that resumed or retried this one (its page
-- links it instead of offering a resume), through jobs_retry_of_idx.
SELECT id FROM jobs WHERE retry_of = :id ORDER BY created_at LIMIT 1

-- resume_workflow --
-- Web role, scoped to the organization, after the submit of the new workflow in the same
-- transaction (see resume_workflow() in the schema: the rule of the cancel, the reused places,
-- the audit row).
SELECT outcome, status, reused, resumed_as
FROM resume_workflow(:old, :new, :user_id, CAST(:kind_roles AS jsonb), :request_id)

-- start_failure_handler --
-- Worker role, holding the failing workflow's lease (see start_failure_handler() in the schema).
SELECT start_failure_handler(:workflow, :token, CAST(:failure AS jsonb), :max_attempts,
                             :lease_seconds)

-- children_of --
SELECT child_index, id, status, result, error_code, error_message
FROM children_of(:parent, :token)

-- fan_out_state --
-- Worker role, holding the parent's lease (see fan_out_state() in the schema).
SELECT total, released, ended FROM fan_out_state(:parent, :token)

-- start_fan_out --
-- Worker role, holding the parent's lease (see start_fan_out() in the schema): the children are
-- admitted against the quotas, or refused_kind and cap say which cap refused them.
SELECT total, released, ended, refused_kind, cap
FROM start_fan_out(:parent, :token, :kind, CAST(:params AS jsonb[]), :max_parallel,
                   :max_attempts, :lease_seconds, CAST(:kind_quota AS integer))

-- workflow_state --
-- Worker role, holding the parent's lease (see workflow_state() in the schema).
SELECT total, released, ended, failed FROM workflow_state(:parent, :token)

-- cancels_asked --
-- Worker role: which of these jobs were asked to cancel (the queue's metadata, no token: the
-- answer only tells a running job to stop at its next checkpoint, as the heartbeat would).
SELECT id FROM jobs WHERE id = ANY (CAST(:ids AS uuid[])) AND status = 'cancel_requested'

-- start_workflow --
-- Worker role, holding the parent's lease (see start_workflow() in the schema): the steps its
-- submit did not reserve are admitted against the quotas, or refused_kind and cap say which
-- cap refused them.
SELECT total, released, ended, failed, refused_kind, cap
FROM start_workflow(:parent, :token, :policy, CAST(:max_parallel AS integer),
                    CAST(:kinds AS text[]), CAST(:params AS jsonb[]), CAST(:after AS jsonb[]),
                    CAST(:max_attempts AS integer[]), CAST(:lease_seconds AS integer[]),
                    CAST(:quotas AS integer[]), CAST(:waits AS jsonb[]))

-- step_inputs --
-- Worker role, holding the step's lease (see step_inputs() in the schema).
SELECT held, inputs FROM step_inputs(:id, :token)

-- cancel_children --
SELECT cancel_children(:parent, :token)

-- sweep_expired_leases --
-- Sweeper (worker role), bounded, the leases that ran out from :from_at on (NULL: from the
-- first; see sweep_expired_leases() in the schema).
SELECT id, status
FROM sweep_expired_leases(:batch, coalesce(CAST(:from_at AS timestamptz), '-infinity'))

-- expired_leases_horizon --
-- Where the next sweep of expired leases may start (see expired_leases_horizon() in the schema).
SELECT expired_leases_horizon(coalesce(CAST(:from_at AS timestamptz), '-infinity'))

-- sweep_unsignalled --
-- Due jobs that nobody claimed within the grace period get a fresh wake-up (see
-- sweep_unsignalled() in the schema): what makes a lost Redis message cost latency, never a job.
SELECT id, kind FROM sweep_unsignalled(:grace, :batch)

-- request_id_of --
SELECT request_id FROM jobs WHERE id = :id

-- snapshot --
-- What an operator's retry copies into its NEW job (terminal rows never come back).
SELECT organization_id, status, requested_by, kind, params FROM jobs WHERE id = :id

-- get --
SELECT id, organization_id, requested_by, kind, status, attempts, max_attempts, progress,
       error_code, error_message, dedup_key, run_after, created_at, updated_at, started_at,
       finished_at, cancel_requested_at, leased_by, lease_until, result_expired_at,
       wait_until, wait_signal, wait_children, sequence_key, parent_id, child_index AS place
FROM jobs WHERE id = :id

-- role_needed --
-- Web role, scoped to the organization (see job_role_needed() in the schema).
SELECT job_role_needed(:id, CAST(:kind_roles AS jsonb))

-- get_result --
-- role_needed: the least role a member needs to read the result (job_role_needed(): a parent's
-- result carries its children's, so it needs the strictest role of what it holds); NULL when
-- the caller passes no roles (a script's wait reads its own job's result).
SELECT id, organization_id, requested_by, kind, status, attempts, max_attempts, progress,
       error_code, error_message, dedup_key, run_after, created_at, updated_at, started_at,
       finished_at, cancel_requested_at, leased_by, lease_until, result_expired_at, result,
       wait_until, wait_signal, wait_children, sequence_key, parent_id, child_index AS place,
       result_ref,
       CASE WHEN CAST(:kind_roles AS jsonb) IS NOT NULL
            THEN job_role_needed(id, CAST(:kind_roles AS jsonb)) END AS role_needed
FROM jobs WHERE id = :id

-- list_for_org --
-- Newest first, keyset pagination on (created_at, id) through jobs_org_created_idx.
SELECT id, organization_id, requested_by, kind, status, attempts, max_attempts, progress,
       error_code, error_message, dedup_key, run_after, created_at, updated_at, started_at,
       finished_at, cancel_requested_at, leased_by, lease_until, result_expired_at,
       wait_until, wait_signal, wait_children, sequence_key, parent_id, child_index AS place
FROM jobs
WHERE organization_id = :organization_id
  AND (CAST(:status AS text) IS NULL OR status = :status)
  AND (CAST(:kind AS text) IS NULL OR kind = :kind)
  AND (CAST(:before_created AS timestamptz) IS NULL
       OR (created_at, id) < (CAST(:before_created AS timestamptz), CAST(:before_id AS uuid)))
ORDER BY created_at DESC, id DESC
LIMIT :limit

-- running --
-- An organization's jobs that someone is running now (a cancel asked for still runs), oldest
-- lease first, through jobs_org_running_idx (lease_until IS NOT NULL: its predicate).
SELECT id, organization_id, requested_by, kind, status, attempts, max_attempts, progress,
       error_code, error_message, dedup_key, run_after, created_at, updated_at, started_at,
       finished_at, cancel_requested_at, leased_by, lease_until, result_expired_at,
       wait_until, wait_signal, wait_children, sequence_key, parent_id, child_index AS place
FROM jobs
WHERE organization_id = :organization_id AND status IN {RUNNING} AND lease_until IS NOT NULL
  AND (CAST(:kind AS text) IS NULL OR kind = :kind)
ORDER BY started_at, id

-- steps_of --
-- Web role, scoped to the organization: the parent and its children are that organization's
-- rows (row-level security) or nothing. A parent job's steps in place order, after the place
-- :after, at most :limit of them, each child found through jobs_children_idx (parent_id,
-- child_index): for a workflow, every step of its compiled graph (params -> 'steps'), whether
-- it is a job yet or not, by name; for any other parent (a fan-out, a kind's own workflow), the
-- children there are and, through job_unmade_steps(), the places its plan holds that are not
-- jobs yet. Names, kinds, statuses and error codes only: never a step's params, result or
-- message. total counts them all (the graph's steps, the plan's, or the children), once. A
-- resumed workflow's place that an earlier run completed is that run's step
-- (job_workflow_reused, the organization's rows under its row-level security).
WITH parent AS MATERIALIZED (
    SELECT p.id,
           CASE WHEN p.kind = 'workflow' AND jsonb_typeof(p.params -> 'steps') = 'array'
                THEN p.params -> 'steps' END AS graph
    FROM jobs p WHERE p.id = :parent
), plan AS MATERIALIZED (
    SELECT u.total, u.places, u.kinds
    FROM parent, job_unmade_steps(parent.id, :after, :limit) AS u
    WHERE parent.graph IS NULL
), graph_steps AS (
    SELECT CAST(s.n - 1 AS integer) AS place, s.step ->> 'name' AS name, s.step ->> 'kind' AS kind
    FROM parent, jsonb_array_elements(parent.graph) WITH ORDINALITY AS s (step, n)
    WHERE s.n - 1 > :after
    ORDER BY s.n
    LIMIT :limit
)
SELECT g.place, g.name, coalesce(c.kind, g.kind) AS kind, c.id, c.status, c.attempts,
       c.error_code, (SELECT jsonb_array_length(parent.graph) FROM parent) AS total
FROM graph_steps g
LEFT JOIN LATERAL (
    SELECT m.kind, m.id, m.status, m.attempts, m.error_code FROM jobs m
    WHERE m.parent_id = :parent AND m.child_index = g.place
    UNION ALL
    SELECT m.kind, m.id, m.status, m.attempts, m.error_code
    FROM job_workflow_reused u JOIN jobs m ON m.id = u.step_id
    WHERE u.parent_id = :parent AND u.place = g.place
    LIMIT 1) AS c ON true
UNION ALL
(SELECT k.place, NULL, k.kind, k.id, k.status, k.attempts, k.error_code,
        coalesce((SELECT plan.total FROM plan),
                 (SELECT count(*) FROM jobs n WHERE n.parent_id = :parent)) AS total
 FROM (SELECT c.child_index AS place, c.kind, c.id, c.status, c.attempts, c.error_code
       FROM parent JOIN jobs c ON c.parent_id = parent.id
       WHERE parent.graph IS NULL AND c.child_index > :after
       UNION ALL
       SELECT u.place, u.kind, NULL, NULL, NULL, NULL
       FROM plan, unnest(plan.places, plan.kinds) AS u (place, kind)) AS k
 ORDER BY k.place
 LIMIT :limit)
ORDER BY place

-- step_results --
-- Web role, scoped to the organization, AFTER the caller checked the member may read the
-- parent's result (the strictest role of what it holds): the results of the parent's steps
-- that completed, in place order after the place :after, at most :limit of them, each with its
-- name (a workflow's, from its graph; NULL for a fan-out's part) and whether retention dropped
-- it. The children are the organization's rows (row-level security) or nothing; a resumed
-- workflow's places that an earlier run completed are that run's steps (job_workflow_reused).
WITH parent AS MATERIALIZED (
    SELECT p.id,
           CASE WHEN p.kind = 'workflow' AND jsonb_typeof(p.params -> 'steps') = 'array'
                THEN p.params -> 'steps' END AS graph
    FROM jobs p WHERE p.id = :parent
), done AS (
    SELECT d.place, d.id, d.kind, d.result, d.result_expired_at
    FROM (SELECT c.child_index AS place, c.id, c.kind, c.result, c.result_expired_at
          FROM parent JOIN jobs c ON c.parent_id = parent.id
          WHERE c.status = 'completed' AND c.child_index > :after
          UNION ALL
          SELECT u.place, c.id, c.kind, c.result, c.result_expired_at
          FROM parent JOIN job_workflow_reused u ON u.parent_id = parent.id
          JOIN jobs c ON c.id = u.step_id
          WHERE u.place > :after) AS d
    ORDER BY d.place
    LIMIT :limit
)
SELECT d.place, d.id, d.kind, d.result, d.result_expired_at, g.step ->> 'name' AS name
FROM done d
LEFT JOIN (SELECT CAST(s.n - 1 AS integer) AS place, s.step
           FROM parent, jsonb_array_elements(parent.graph) WITH ORDINALITY AS s (step, n)) AS g
       ON g.place = d.place
ORDER BY d.place

-- lock_lease --
-- Taken at the end of every tenant transaction of a job: its writes commit only while the
-- attempt still holds the lease, and nobody can re-claim the row until that commit.
SELECT lock_lease(:id, :lease_token)

-- purge_finished --
-- Retention, bounded per call, past the ages of the database's retention_policy, each step from
-- its horizon (NULL: from the first); the function is in models/db/schema/80_retention.sql (it
-- never touches an active job).
SELECT * FROM purge_finished_jobs(:batch, CAST(:jobs_from AS timestamptz),
                                  CAST(:results_from AS timestamptz),
                                  CAST(:events_from AS timestamptz))

-- claim_controls --
-- Operator controls (tiny table): paused kinds are never claimed, limited kinds are counted.
SELECT kind, paused, concurrency_limit FROM kind_settings
WHERE paused OR concurrency_limit IS NOT NULL

-- lock_kind --
-- Serializes claims of ONE limited kind across every worker on every host, for the rest of the
-- claim transaction, so that the count below cannot be raced past the limit.
SELECT pg_advisory_xact_lock(hashtext('spacejobs.kind:' || :kind))

-- count_running --
-- Through jobs_lease_expiry_idx (lease_until IS NOT NULL: its predicate): running jobs are few.
SELECT count(*) FROM jobs WHERE kind = :kind AND status IN {RUNNING} AND lease_until IS NOT NULL

-- fold_metrics --
-- The metric events after :after (NULL: from the first) into the counters, bounded; how many,
-- and the last id folded (see fold_metric_events() in the schema).
SELECT f.folded, f.last_id FROM fold_metric_events(:batch, CAST(:after AS bigint)) AS f

-- advance_claim_heads --
-- The claim heads of at most :orgs organizations after :after forward to their first queued
-- jobs, no further than :lag_seconds ago (see advance_claim_heads() in the schema): how many
-- moved (NULL when a transaction that made jobs claimable was open and nothing moved), and the
-- last organization visited.
SELECT a.moved, a.last_org
FROM advance_claim_heads(make_interval(secs => :lag_seconds), make_interval(secs => :idle_seconds),
                         CAST(:after AS uuid), CAST(:orgs AS integer)) AS a

-- wait_job --
-- The lease holder ends its run to wait (see wait_job() in the schema): the new status, or
-- NULL when the lease is no longer the caller's.
SELECT wait_job(:id, :lease_token, :until, :signal, :children)

-- resume_due_waits --
SELECT id, kind FROM resume_due_waits(:batch)

-- resume_due_timers --
-- Beat's short cadence: the timers alone (see resume_due_timers() in the schema).
SELECT id, kind FROM resume_due_timers(:batch)

-- signal_job --
-- Web role, scoped to the organization (see signal_job() in the schema).
SELECT outcome, status, receiver FROM signal_job(:id, :name, CAST(:payload AS jsonb), :user_id,
                                                 CAST(:kind_roles AS jsonb))

-- step_result --
-- A step the held job recorded earlier (see step_result() in the schema).
SELECT held, found, result FROM step_result(:job_id, :lease_token, :name)

-- record_step --
-- In the lease holder's fenced transaction: the first record of a name stays.
SELECT record_step(:job_id, :lease_token, :name, CAST(:result AS jsonb))

-- take_signal --
-- The oldest signal of that name not taken yet, taken now and recorded as the step, with its
-- sender (see take_signal() in the schema).
SELECT held, taken, recorded FROM take_signal(:job_id, :lease_token, :name, :step)

