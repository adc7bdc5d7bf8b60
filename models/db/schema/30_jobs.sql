-- Jobs and what hangs off them: their events and diagnostics, the quotas on active jobs and
-- the counts those are checked against. What may move a job is in 40_job_transitions.sql.

CREATE TABLE jobs (
    id                   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    organization_id      uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    requested_by         uuid NOT NULL REFERENCES users (id),
    kind                 text NOT NULL CHECK (kind ~ '^[a-z][a-z0-9_.]{0,63}$'),
    status               text NOT NULL DEFAULT 'queued' CHECK (status IN
                         ('queued', 'leased', 'cancel_requested', 'waiting', 'completed', 'failed',
                          'cancelled')),
    params               jsonb NOT NULL DEFAULT '{}',
    lease_token          uuid,
    lease_until          timestamptz,
    leased_by            text,
    lease_seconds        integer NOT NULL CHECK (lease_seconds > 0),
    attempts             integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts         integer NOT NULL CHECK (max_attempts >= 1),
    run_after            timestamptz NOT NULL DEFAULT now(),
    progress             jsonb,
    result               jsonb,
    result_ref           text,
    error_code           text,
    error_message        text,
    dedup_key            text,
    idempotency_key      text,
    request_id           text,
    -- When a wake-up was last sent for it: set at submit (the web sends one right after
    -- commit) and by the sweeper; cleared when the job is put back in the queue, which
    -- means "nobody has signalled it since".
    last_wakeup_at       timestamptz DEFAULT now(),
    cancel_requested_by  uuid REFERENCES users (id),
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    started_at           timestamptz,
    finished_at          timestamptz,
    cancel_requested_at  timestamptz,
    -- set when retention dropped the result of a finished job (the API then answers 410)
    result_expired_at    timestamptz,
    -- The job an operator's retry copied (ops/actions.sql); NULL once retention deleted it.
    -- Last because revision 0003 added it: both install paths keep the same column order.
    retry_of             uuid REFERENCES jobs (id) ON DELETE SET NULL,
    -- Taken first within its organization (claim_jobs); -10 to 10.
    priority             smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN -10 AND 10),
    -- A fan-out's child: its parent job and its place among the parent's items.
    parent_id            uuid REFERENCES jobs (id) ON DELETE CASCADE,
    child_index          integer CHECK (child_index >= 0),
    -- What a waiting job waits for (45_waiting.sql): a moment, a signal by name, or its
    -- children (the number of them still active when it began to wait). Set by wait_job().
    wait_until           timestamptz,
    wait_signal          text,
    wait_children        integer,
    -- The W3C trace context of whatever submitted it (revision 0034): the workers' spans of
    -- its attempts are children of it. Only ids and flags, never anything of the tenant's;
    -- version 00 only, the one format we write. A child inherits its parent's (70_fan_out.sql).
    traceparent          text CONSTRAINT jobs_traceparent_w3c
                         CHECK (traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'),
    -- Flow control (revision 0037, docs/concepts/flow-control.md). A sequence: jobs of the
    -- organization with the same key run one at a time in the order of their places (taken
    -- from job_sequence_positions under the key's lock at submit).
    sequence_key         text CONSTRAINT jobs_sequence_key_length
                         CHECK (length(sequence_key) BETWEEN 1 AND 200),
    sequence_position    bigint,
    -- A debounced job: while queued and never started, a submit of its dedup_key replaces its
    -- params and starts it this many seconds later (submit_job()).
    debounce_seconds     integer CONSTRAINT jobs_debounce_seconds_range
                         CHECK (debounce_seconds BETWEEN 1 AND 86400),
    -- Who submitted it when that is not its requester (an operator's retry, a worker's
    -- children, the CLI): the actor of its birth in job_history. NULL, the common case, is the
    -- requester.
    submitted_as         text,
    -- When the worker leased it, while its history holds that lease here instead of in a
    -- job_events row (job_history): a lease from the queue, taken by the process the
    -- transaction's actor names; it stays when that lease ends in its completion by the same
    -- process, whose moment is finished_at. Any other move clears it and stores both as events
    -- (jobs_check_transition(), jobs_after_update()).
    lease_event_at       timestamptz,
    CONSTRAINT jobs_lease_event_on_row CHECK (lease_event_at IS NULL
                                              OR status IN ('leased', 'completed')),
    CONSTRAINT jobs_child_has_a_parent CHECK ((parent_id IS NULL) = (child_index IS NULL)),
    -- A lease exists exactly while someone may be running the job.
    CHECK ((status IN ('leased', 'cancel_requested')) =
           (lease_token IS NOT NULL AND lease_until IS NOT NULL)),
    -- A waiting job waits for something, and only a waiting job does.
    CONSTRAINT jobs_waiting_waits_for_something CHECK ((status = 'waiting') =
           (wait_until IS NOT NULL OR wait_signal IS NOT NULL OR wait_children IS NOT NULL)),
    CONSTRAINT jobs_sequence_has_a_place CHECK ((sequence_key IS NULL) = (sequence_position IS NULL)),
    CONSTRAINT jobs_debounce_has_a_key CHECK (debounce_seconds IS NULL OR dedup_key IS NOT NULL)
)
-- Two thirds of each page are left for a job's later versions: its claim and its finish (each
-- a new version, since they change indexed columns) land beside the first one, and PostgreSQL
-- then logs only the changed middle of a version, not all of it (bench.cost, whole life of a
-- job: 919 bytes of jobs' WAL at fillfactor 100, 776 at 60, 698 at 35; the table did not grow).
WITH (fillfactor = 35);

-- The places of jobs in their sequences: taken under the sequence's lock (submit_job()).
CREATE SEQUENCE job_sequence_positions AS bigint;

-- The claim reads only these partial indexes, so its cost follows the number of ACTIVE jobs,
-- not the millions of finished rows behind them. No index of every organization's queued jobs
-- by run_after (jobs_claimable_idx until revision 0056): a generic plan of the claim read it
-- instead of jobs_fair_claim_idx, through every organization's jobs to find one's, and its
-- readers (the oldest due job's age) walked it from its beginning, where a long-open
-- transaction keeps every job queued since it began; they read from the claim's heads now
-- (due_queue_ages(), oldest_due()).
-- The leases held, by when they end (the sweeper's expired leases). This index and
-- jobs_org_running_idx are built on lease_until, not on status: a statement that finds a job by
-- its id and lease token, its status among the leased ones, must not be able to read them
-- instead of jobs_pkey. The planner counts only their live entries and chose them for every
-- fenced finish and lease check, and behind a long-open transaction they hold the entry of
-- every lease taken since it began (25 minutes into a hold at 200 jobs/s: lock_lease() 95 ms,
-- a finish of 20 jobs 32,000 buffers and 129 ms, revision 0053). lease_until is set while a
-- lease is held, and every statement that ends one clears it; the statements that read these
-- indexes say lease_until IS NOT NULL, or compare it, and check the status all the same.
CREATE INDEX jobs_lease_expiry_idx ON jobs (lease_until) WHERE lease_until IS NOT NULL;
-- The sweeper's timers (resume_due_waits): waiting jobs by the moment they wait for.
CREATE INDEX jobs_waiting_idx ON jobs (wait_until) WHERE status = 'waiting';
-- claim_jobs: an organization's queued jobs in the order they are taken, and (its leading
-- column) the organizations that have any, found one index probe each.
CREATE INDEX jobs_fair_claim_idx ON jobs (organization_id, priority DESC, run_after, created_at)
    WHERE status = 'queued';
-- A parent's children by place (children_of), and each place taken once: a re-run parent's
-- spawn of a child that exists is a no-op.
CREATE UNIQUE INDEX jobs_children_idx ON jobs (parent_id, child_index) WHERE parent_id IS NOT NULL;
-- Tenant listing, newest first, with keyset pagination.
CREATE INDEX jobs_org_created_idx ON jobs (organization_id, created_at DESC, id DESC);
-- Retention walks finished rows by age: whole jobs (this one), results still held (the next).
CREATE INDEX jobs_finished_idx ON jobs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_result_retention_idx ON jobs (finished_at)
    WHERE result IS NOT NULL AND result_expired_at IS NULL;
-- The orphan sweep's check of rows against the store (results_without_files): stored results only.
CREATE INDEX jobs_result_ref_idx ON jobs (finished_at) WHERE result_ref IS NOT NULL;
-- At most one ACTIVE job per (organization, kind, dedup_key), across every web instance. A
-- debounced key is not an active duplicate: while its job is queued and never started, a
-- submit of the key updates that job (jobs_debounce_idx), and after that it makes a new one.
CREATE UNIQUE INDEX jobs_dedup_active_idx ON jobs (organization_id, kind, dedup_key)
    WHERE dedup_key IS NOT NULL AND debounce_seconds IS NULL
      AND status IN ('queued', 'leased', 'cancel_requested', 'waiting');
CREATE UNIQUE INDEX jobs_debounce_idx ON jobs (organization_id, kind, dedup_key)
    WHERE debounce_seconds IS NOT NULL AND status = 'queued' AND attempts = 0;
-- claim_jobs: a sequence's unfinished jobs by place (an earlier one holds the later back).
CREATE INDEX jobs_sequence_idx ON jobs (organization_id, sequence_key, sequence_position)
    WHERE sequence_key IS NOT NULL
      AND status IN ('queued', 'leased', 'cancel_requested', 'waiting');
-- claim_jobs: how many jobs an organization runs now (its fair share by time), read from now on:
-- the entries of leases that ended before now (finished jobs' among them, until vacuum may
-- remove them) come first, and are not walked.
CREATE INDEX jobs_org_running_idx ON jobs (organization_id, lease_until)
    WHERE lease_until IS NOT NULL;
-- claim_jobs: a rate-limited kind's organizations with queued jobs, and their jobs in order.
-- `kind IS NOT NULL` (always true: the column is NOT NULL) is there so that only a statement
-- that names a kind can read it: the fair claim names none, and its generic plan, which counts
-- only this index's live entries, read it whole in place of jobs_fair_claim_idx (its first
-- column unbounded), through every job queued since a long-open transaction began (revision
-- 0057).
CREATE INDEX jobs_kind_claim_idx ON jobs (kind, organization_id, priority DESC, run_after,
                                          created_at)
    WHERE status = 'queued' AND kind IS NOT NULL;
-- Replays of a submit with the same Idempotency-Key by the same user find the first job.
CREATE UNIQUE INDEX jobs_idempotency_idx ON jobs (organization_id, requested_by, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- The jobs that resume or retry another (resume_workflow() finds a workflow's resume; the
-- foreign key's SET NULL when retention deletes the one they came from): few, so partial.
CREATE INDEX jobs_retry_of_idx ON jobs (retry_of) WHERE retry_of IS NOT NULL;

-- Operators' overrides: kind '' caps the organization as a whole, any other kind caps that
-- kind's jobs in the organization. Without a row the defaults apply (quota_policy's for the
-- organization, the quota a kind declares for a kind). Written by the owner only (the CLI's
-- `orgs set-quota`), read only by admit_jobs() as the owner: no application role has a grant,
-- and row-level security keeps the owner's own policy the only way in.
CREATE TABLE job_quotas (
    organization_id  uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    kind             text NOT NULL CHECK (kind = '' OR kind ~ '^[a-z][a-z0-9_.]{0,63}$'),
    max_active       integer NOT NULL CHECK (max_active >= 0),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, kind)
);

-- The cap on every organization's active jobs, unless job_quotas says otherwise: a policy the
-- database holds, like retention_policy, so that no caller of the submit functions can choose it
-- (`spacejobs db upgrade` writes SPACEJOBS_ACTIVE_JOBS_QUOTA into it when set). The owner's alone.
CREATE TABLE quota_policy (
    -- one row: the policy of this database
    singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    active_jobs  integer NOT NULL DEFAULT 1000 CHECK (active_jobs >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
INSERT INTO quota_policy DEFAULT VALUES;

-- Operators' rate limits: at most max_starts jobs of the kind start in the organization in any
-- per_seconds. Without a row the kind's own (a declared rate_limit) applies, or none. Written by
-- the owner (the CLI's `orgs set-rate-limit`) and by set_rate_limit() (the operators'
-- dashboard); read by claim_jobs() as the owner and by the operators' dashboard.
CREATE TABLE job_rate_limits (
    organization_id  uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    kind             text NOT NULL CHECK (kind ~ '^[a-z][a-z0-9_.]{0,63}$'),
    max_starts       integer NOT NULL CHECK (max_starts BETWEEN 1 AND 10000),
    per_seconds      integer NOT NULL CHECK (per_seconds BETWEEN 1 AND 86400),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, kind)
);

-- The recent starts of each rate-limited (organization, kind): the window's worth, newest
-- first, at most the limit. Its row lock is what claimers of the pair take turns on
-- (claim_jobs()). The owner's alone.
CREATE TABLE rate_limit_windows (
    organization_id  uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    kind             text NOT NULL,
    starts           timestamptz[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (organization_id, kind)
);

-- An organization's active jobs (queued, leased, cancel_requested), per kind, kept up to date by
-- the jobs triggers in the statement that changes them, so that a submit's quota check reads a
-- few rows instead of counting every active job (revision 0024). The count of (organization,
-- kind) is the sum of its rows; there is one row per slot, and a slot is held by one writing
-- transaction at a time (add_active_jobs()), so concurrent writers never wait on each other's
-- row locks here. The owner's alone, like job_quotas: only the SECURITY DEFINER triggers write
-- it, only admit_jobs() reads it. No foreign key: an organization's deletion cascades to its
-- jobs, whose delete trigger takes their counts back.
CREATE TABLE active_job_counts (
    organization_id  uuid NOT NULL,
    kind             text NOT NULL,
    slot             smallint NOT NULL,
    active           bigint NOT NULL,
    PRIMARY KEY (organization_id, kind, slot)
);

-- The children a parent will make and has not made yet (a workflow's steps, a fan-out's
-- items), counted as active in advance: the whole plan is admitted against the quotas when it
-- is submitted (a workflow) or started (start_fan_out(), start_workflow()), and each child made
-- later takes its place here (release_children(), release_steps()). One row per parent and
-- kind. Its triggers keep active_job_counts in step with it (40_job_transitions.sql); the jobs
-- triggers drop a parent's rows when it ends or is deleted, hence no foreign key, as for
-- active_job_counts. The owner's alone.
CREATE TABLE job_reservations (
    parent_id        uuid NOT NULL,
    organization_id  uuid NOT NULL,
    kind             text NOT NULL,
    reserved         integer NOT NULL CHECK (reserved >= 0),
    PRIMARY KEY (parent_id, kind)
);

-- Written only by the jobs_after_insert and jobs_after_update triggers (40_job_transitions.sql),
-- from a jobs row in the same statement, and deleted with their job by
-- jobs_after_delete/jobs_after_truncate: no foreign keys, whose per-row checks cost the hot path
-- and could never fail (revision 0015).
-- Keyed by the job and then its order: a job's history in order (the API's events,
-- ops/dashboard.sql job_events) is the key's own index, the one index an event writes.
CREATE TABLE job_events (
    id               bigint GENERATED ALWAYS AS IDENTITY,
    job_id           uuid NOT NULL,
    organization_id  uuid NOT NULL,
    from_status      text,
    to_status        text NOT NULL,
    attempt          integer NOT NULL,
    actor            text NOT NULL,
    at               timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, id)
);

-- Operator-only technical detail of a failed attempt. Never shown to tenants.
CREATE TABLE job_diagnostics (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id           uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    organization_id  uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    attempt          integer NOT NULL,
    worker           text,
    exception_class  text NOT NULL,
    traceback        text NOT NULL,
    at               timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- A job's diagnostics in order (ops/dashboard.sql job_diagnostics).
CREATE INDEX job_diagnostics_job_idx ON job_diagnostics (job_id, id);

-- =============================================================================================
-- Row-level security
-- =============================================================================================

-- jobs, web: strictly the scoped organization (submit, list, read, cancel).
-- jobs, worker: the shared queue's metadata across organizations, read only; every change goes
-- through a function (60_claim_and_lease.sql: without the lease token, nothing). Nobody
-- deletes: retention is purge_finished_jobs(), as the owner.
ALTER TABLE jobs ENABLE ROW LEVEL SECURITY;
ALTER TABLE jobs FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON jobs TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY tenant_rw ON jobs TO space_app
    USING (organization_id = app_org()) WITH CHECK (organization_id = app_org());
CREATE POLICY worker_queue_read ON jobs FOR SELECT TO space_worker USING (true);
CREATE POLICY operator_read ON jobs FOR SELECT TO space_operator USING (true);

-- job_events: written only by the SECURITY DEFINER job triggers (as the owner), read per
-- organization.
ALTER TABLE job_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_events FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_events TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY worker_read ON job_events FOR SELECT TO space_worker
    USING (organization_id = app_org());
CREATE POLICY operator_read ON job_events FOR SELECT TO space_operator USING (true);
CREATE POLICY tenant_read ON job_events FOR SELECT TO space_app
    USING (organization_id = app_org());

-- A job's whole history: its birth, read from its row, then its stored events, then the lease
-- and completion its row holds. A job born queued has no job_events row for its birth: the
-- row says who asked (requested_by, submitted_as) and when (created_at), and a row and its key
-- per submit were 258 of the 3,247 bytes of WAL a job wrote (bench.cost, revision 0060). A
-- row the owner plants in another state (a restore, a test's set-up) keeps its birth as a
-- stored event from 'queued' (jobs_after_insert()). Nor has a job that ran once and completed
-- a row for its lease or its completion (revision 0061: two rows and their keys, 495 of the
-- 2,984 bytes left): lease_event_at says when the process its leased_by names leased it, and
-- finished_at when that process completed it; a job whose lease ends any other way (a retry,
-- a wait, a cancel, an expiry) stores both. The birth sorts first (id 0; stored events count
-- from 1), the row's lease and completion last, and they live as long as the job's row, past
-- the retention of its stored events.
-- security_invoker: each reader sees the rows its own policies let it see, and the worker,
-- which reads every organization's jobs but only its scoped organization's events, sees only
-- that organization's births, leases and completions too.
CREATE VIEW job_history WITH (security_invoker = true) AS
SELECT 0::bigint AS id, j.id AS job_id, j.organization_id, NULL::text AS from_status,
       'queued'::text AS to_status, 0 AS attempt,
       coalesce(j.submitted_as, 'user:' || j.requested_by) AS actor, j.created_at AS at
FROM jobs j
WHERE current_user <> 'space_worker' OR j.organization_id = app_org()
UNION ALL
SELECT e.id, e.job_id, e.organization_id, e.from_status, e.to_status, e.attempt, e.actor, e.at
FROM job_events e
UNION ALL
SELECT l.id, j.id, j.organization_id, l.from_status, l.to_status, j.attempts,
       'worker:' || j.leased_by, l.at
FROM jobs j
CROSS JOIN LATERAL (VALUES
    (9223372036854775806, 'queued', 'leased', j.lease_event_at, true),
    -- (finished_at is its transaction's start: never before the lease when both were in one)
    (9223372036854775807, 'leased', 'completed', greatest(j.finished_at, j.lease_event_at),
     j.status = 'completed')
) AS l (id, from_status, to_status, at, held)
WHERE j.lease_event_at IS NOT NULL AND l.held
  AND (current_user <> 'space_worker' OR j.organization_id = app_org());

-- job_diagnostics: written with a failed attempt by fail_job() (as the owner, for the lease
-- holder), read by operators, never by tenants.
ALTER TABLE job_diagnostics ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_diagnostics FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_diagnostics TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY operator_read ON job_diagnostics FOR SELECT TO space_operator USING (true);

-- job_quotas: the owner's alone (the CLI writes, the submit functions read as the owner).
ALTER TABLE job_quotas ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_quotas FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_quotas TO space_owner USING (true) WITH CHECK (true);

-- active_job_counts: the owner's alone (the jobs triggers write, admit_jobs() reads, as the owner).
ALTER TABLE active_job_counts ENABLE ROW LEVEL SECURITY;
ALTER TABLE active_job_counts FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON active_job_counts TO space_owner USING (true) WITH CHECK (true);

-- quota_policy and job_reservations: the owner's alone (the submit and start functions read and
-- write them as the owner).
ALTER TABLE quota_policy ENABLE ROW LEVEL SECURITY;
ALTER TABLE quota_policy FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON quota_policy TO space_owner USING (true) WITH CHECK (true);
ALTER TABLE job_reservations ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_reservations FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_reservations TO space_owner USING (true) WITH CHECK (true);

-- job_rate_limits: the owner writes (and set_rate_limit()); operators read.
ALTER TABLE job_rate_limits ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_rate_limits FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_rate_limits TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY operator_read ON job_rate_limits FOR SELECT TO space_operator USING (true);

-- rate_limit_windows: the owner's alone (claim_jobs() reads and writes it as the owner).
ALTER TABLE rate_limit_windows ENABLE ROW LEVEL SECURITY;
ALTER TABLE rate_limit_windows FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON rate_limit_windows TO space_owner USING (true) WITH CHECK (true);

-- =============================================================================================
-- Grants
-- =============================================================================================

-- space_app: read jobs (never the lease token), ask to cancel; jobs are written only through
-- submit_job(s)().
GRANT SELECT (id, organization_id, requested_by, kind, status, params, lease_until, leased_by,
              lease_seconds, attempts, max_attempts, run_after, progress, result, result_ref,
              error_code, error_message, dedup_key, idempotency_key, request_id, last_wakeup_at,
              cancel_requested_by, created_at, updated_at, started_at, finished_at,
              cancel_requested_at, result_expired_at, retry_of)
    ON jobs TO space_app;
GRANT UPDATE (status, cancel_requested_at, cancel_requested_by) ON jobs TO space_app;
GRANT SELECT ON job_events, job_history TO space_app;

-- space_worker: the queue's metadata across organizations, never a params, a result or a lease
-- token (params and tokens come from claim_jobs() for the jobs it leases); it changes a job only
-- through the functions that take its lease token, and deletes nothing.
GRANT SELECT (id, organization_id, requested_by, kind, status, lease_until,
              leased_by, lease_seconds, attempts, max_attempts, run_after, progress,
              error_code, error_message, dedup_key, request_id, last_wakeup_at,
              cancel_requested_by, created_at, updated_at, started_at, finished_at,
              cancel_requested_at, result_expired_at, retry_of)
    ON jobs TO space_worker;
GRANT SELECT ON job_events, job_history TO space_worker;

-- space_operator: job metadata across organizations, never params, result or the lease token
-- (hence the column lists).
GRANT SELECT ON job_events, job_history, job_diagnostics TO space_operator;
GRANT SELECT (id, organization_id, requested_by, kind, status, leased_by, lease_until,
              lease_seconds, attempts, max_attempts, run_after, progress, result_ref, error_code,
              error_message, dedup_key, request_id, last_wakeup_at, cancel_requested_by,
              created_at, updated_at, started_at, finished_at, cancel_requested_at,
              result_expired_at, retry_of)
    ON jobs TO space_operator;

-- Every role sees a fan-out's shape: which child belongs to which parent.
GRANT SELECT (parent_id, child_index) ON jobs TO space_app, space_worker, space_operator;

-- Every role sees what a waiting job waits for; only wait_job() and the resumes write it.
GRANT SELECT (wait_until, wait_signal, wait_children) ON jobs
    TO space_app, space_worker, space_operator;

-- Every role that reads a job's history reads who submitted it, and the lease its row holds.
GRANT SELECT (submitted_as, lease_event_at) ON jobs TO space_app, space_worker, space_operator;

-- Only the worker reads a job's trace context, to parent its attempts' spans; the submit
-- functions and the children's trigger write it, as the owner.
GRANT SELECT (traceparent) ON jobs TO space_worker;

-- Every role sees a job's sequence and debounce; only the submit functions write them.
GRANT SELECT (sequence_key, sequence_position, debounce_seconds) ON jobs
    TO space_app, space_worker, space_operator;
GRANT SELECT ON job_rate_limits TO space_operator;
