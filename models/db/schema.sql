-- Space Jobs: the whole current schema, as one file to read and review.
--
-- A fresh database gets this file and is stamped at the newest revision (models/db/migrate.py);
-- an existing database is upgraded through the frozen revisions in migrations/versions/. The
-- two must produce the same catalog: tests/integration/test_migrations.py builds one database
-- each way and fails on any difference. So a schema change is a new revision AND the same
-- change folded in here (README, "Changing the schema").
--
-- Runs as the owner role (space_owner), never as a superuser, so FORCE ROW LEVEL SECURITY
-- applies to the owner too. The roles themselves, and USAGE on the schema, come first from
-- models/db/migrate.sql (cluster-wide objects an owner role may not create).
--
-- Contents: tenant context · tables and the indexes their queries need · metric functions ·
-- job triggers · submits · retention · the audit log's triggers · row-level security · grants.

-- =============================================================================================
-- Tenant context
-- =============================================================================================

-- The tenant of the current transaction and the authenticated user, set by our own code with
-- set_config(..., true). After such a transaction ends the same pooled connection reads '' (not
-- NULL), hence nullif. A missing setting means "no tenant": every tenant policy then matches nothing.
CREATE FUNCTION app_org() RETURNS uuid LANGUAGE sql STABLE AS
$$ SELECT nullif(current_setting('app.organization_id', true), '')::uuid $$;

CREATE FUNCTION app_user() RETURNS uuid LANGUAGE sql STABLE AS
$$ SELECT nullif(current_setting('app.user_id', true), '')::uuid $$;

-- Who is acting, in the words job_events.actor uses ('user:<id>', 'operator:<id>', 'cli', …);
-- NULL when our code did not say.
CREATE FUNCTION app_actor() RETURNS text LANGUAGE sql STABLE AS
$$ SELECT nullif(current_setting('app.actor', true), '') $$;

-- =============================================================================================
-- Tenants, users, tokens, tenant data
-- =============================================================================================

CREATE TABLE organizations (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    state       text NOT NULL DEFAULT 'active'
                CHECK (state IN ('active', 'read_only', 'deleting', 'deleted')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    -- Its share of each claim when several organizations have work (claim_jobs), 1 to 100.
    claim_weight smallint NOT NULL DEFAULT 1 CHECK (claim_weight BETWEEN 1 AND 100)
);

CREATE TABLE users (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    email        text NOT NULL CHECK (email = lower(email) AND email LIKE '%_@_%'),
    name         text NOT NULL DEFAULT '',
    is_operator  boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (email)
);

-- Only a SHA-256 of the token is stored; the token itself is shown once, at creation.
CREATE TABLE api_tokens (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id       uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    token_hash    bytea NOT NULL UNIQUE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz
);

CREATE TABLE memberships (
    organization_id  uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    user_id          uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role             text NOT NULL CHECK (role IN ('owner', 'admin', 'member')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, user_id)
);
-- A user's own memberships across organizations: /me (tenancy/accounts.sql my_memberships) and
-- the organizations policy below, which runs before a tenant is chosen.
CREATE INDEX memberships_user_idx ON memberships (user_id);

CREATE TABLE projects (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    organization_id  uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    name             text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    description      text NOT NULL DEFAULT '',
    -- The import job that created the row: a retried import finds its own earlier writes.
    created_by_job   uuid,
    created_at       timestamptz NOT NULL DEFAULT now()
);
-- tenancy/projects.sql created_by_job: a retried import's lookup of its earlier writes.
CREATE INDEX projects_created_by_job_idx ON projects (created_by_job) WHERE created_by_job IS NOT NULL;
-- tenancy/projects.sql list: one organization's projects in creation order.
CREATE INDEX projects_org_idx ON projects (organization_id, created_at, id);

-- =============================================================================================
-- Jobs
-- =============================================================================================

CREATE TABLE jobs (
    id                   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    organization_id      uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    requested_by         uuid NOT NULL REFERENCES users (id),
    kind                 text NOT NULL CHECK (kind ~ '^[a-z][a-z0-9_.]{0,63}$'),
    status               text NOT NULL DEFAULT 'queued' CHECK (status IN
                         ('queued', 'leased', 'cancel_requested', 'completed', 'failed', 'cancelled')),
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
    CONSTRAINT jobs_child_has_a_parent CHECK ((parent_id IS NULL) = (child_index IS NULL)),
    -- A lease exists exactly while someone may be running the job.
    CHECK ((status IN ('leased', 'cancel_requested')) =
           (lease_token IS NOT NULL AND lease_until IS NOT NULL))
);

-- The claim reads only these partial indexes, so its cost follows the number of ACTIVE jobs,
-- not the millions of finished rows behind them.
CREATE INDEX jobs_claimable_idx ON jobs (run_after, created_at) WHERE status = 'queued';
CREATE INDEX jobs_lease_expiry_idx ON jobs (lease_until) WHERE status IN ('leased', 'cancel_requested');
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
-- At most one ACTIVE job per (organization, kind, dedup_key), across every web instance.
CREATE UNIQUE INDEX jobs_dedup_active_idx ON jobs (organization_id, kind, dedup_key)
    WHERE dedup_key IS NOT NULL AND status IN ('queued', 'leased', 'cancel_requested');
-- Replays of a submit with the same Idempotency-Key by the same user find the first job.
CREATE UNIQUE INDEX jobs_idempotency_idx ON jobs (organization_id, requested_by, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Operators' overrides: kind '' caps the organization as a whole, any other kind caps that
-- kind's jobs in the organization. Without a row the caller's defaults apply (the setting
-- SPACEJOBS_ACTIVE_JOBS_QUOTA, and the quota a kind declares). Written by the owner only (the
-- CLI's `orgs set-quota`), read only by admit_jobs() as the owner: no application role has a
-- grant, and row-level security keeps the owner's own policy the only way in.
CREATE TABLE job_quotas (
    organization_id  uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    kind             text NOT NULL CHECK (kind = '' OR kind ~ '^[a-z][a-z0-9_.]{0,63}$'),
    max_active       integer NOT NULL CHECK (max_active >= 0),
    updated_at       timestamptz NOT NULL DEFAULT now(),
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

-- Written only by the jobs_after_insert and jobs_after_update triggers below, from a jobs row in
-- the same statement, and deleted with their job by jobs_after_delete/jobs_after_truncate: no
-- foreign keys, whose per-row checks cost the hot path and could never fail (revision 0015).
CREATE TABLE job_events (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id           uuid NOT NULL,
    organization_id  uuid NOT NULL,
    from_status      text,
    to_status        text NOT NULL,
    attempt          integer NOT NULL,
    actor            text NOT NULL,
    at               timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- A job's history in order (the API's events, ops/dashboard.sql job_events).
CREATE INDEX job_events_job_idx ON job_events (job_id, id);

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
-- The organizations' audit log
-- =============================================================================================

-- What people did in an organization, for its owners and admins: who started, cancelled or
-- downloaded which job, who joined or left it or changed role, how its state changed. Written
-- in the transaction of the action itself (a rolled-back action leaves no entry); append-only
-- for the application roles (INSERT, never UPDATE or DELETE); retention is purge_org_audit(),
-- as the owner, past the age retention_policy holds. Never a job's params or result: detail
-- holds names (a kind, a role, a state) and ids, under the few keys the CHECK allows.
CREATE TABLE org_audit (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    organization_id  uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    -- the user who acted; NULL for the CLI and other administrative sessions
    actor_id         uuid,
    -- how, in job_events.actor's words: 'user:<id>', 'operator:<id>', 'cli', …
    actor            text NOT NULL,
    action           text NOT NULL CHECK (action IN (
                         'job.submit', 'job.cancel', 'job.download', 'member.add',
                         'member.role_change', 'member.remove', 'organization.state_change')),
    -- The target: a job or a member. No foreign keys: an entry outlives the job (retention)
    -- and the user.
    job_id           uuid,
    member_id        uuid,
    detail           jsonb NOT NULL DEFAULT '{}' CHECK (
                         jsonb_typeof(detail) = 'object'
                         AND detail - ARRAY['kind', 'bulk', 'retry_of', 'status', 'role', 'from',
                                            'to'] = '{}'
                         AND length(detail::text) <= 500),
    request_id       text,
    at               timestamptz NOT NULL DEFAULT now()
);
-- The API's listing, newest first, with keyset pagination (tenancy/audit.sql entries).
CREATE INDEX org_audit_org_at_idx ON org_audit (organization_id, at, id);
-- Retention by age (purge_org_audit()): rows arrive in time order and never change, so a BRIN
-- index is a few pages and costs an insert next to nothing.
CREATE INDEX org_audit_at_idx ON org_audit USING brin (at);

-- =============================================================================================
-- People: passwords the web never reads, revocable server-side web sessions
-- =============================================================================================
--
-- Neither table holds an organization_id (a person signs in once, then acts in whichever
-- organization the URL names, re-checked on every request), so neither needs row-level security;
-- access is by grant alone.

-- One argon2id hash per user, in PHC string form ($argon2id$v=19$m=…,t=…,p=…$salt$digest).
-- Kept out of `users` so that no role's grant on `users` can ever reach it: only the owner (the
-- CLI's `users set-password`) reads or writes this table.
CREATE TABLE user_passwords (
    user_id        uuid PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
    password_hash  text NOT NULL CHECK (password_hash LIKE '$argon2id$%'),
    changed_at     timestamptz NOT NULL DEFAULT now()
);

-- The web never reads a stored digest. login_challenge gives it the hash WITHOUT its last field
-- (algorithm, version, costs and salt: what is needed to hash a candidate password the same
-- way); the web hashes the password it was given and check_login compares the whole string
-- inside the database. A compromised web process can therefore test guesses one argon2
-- computation at a time, as the sign-in form can, but cannot carry the hashes away in bulk for
-- offline cracking.
CREATE FUNCTION login_challenge(p_email text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT regexp_replace(p.password_hash, '\$[^$]*$', '')
    FROM users u JOIN user_passwords p ON p.user_id = u.id
    WHERE u.email = lower(p_email)
$$;

CREATE FUNCTION check_login(p_email text, p_candidate text) RETURNS uuid
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT u.id
    FROM users u JOIN user_passwords p ON p.user_id = u.id
    WHERE u.email = lower(p_email) AND p.password_hash = p_candidate
$$;



-- A signed-in browser. The cookie carries the session id; only its SHA-256 is stored, so a
-- copy of this table opens no session. Every request re-reads the row: a revoked, expired or
-- idle session (or a deleted user: ON DELETE CASCADE) is out at once. The CSRF token of the
-- session's forms is derived from the id by the web (an HMAC), so nothing secret is kept here.
CREATE TABLE web_sessions (
    id_hash       bytea PRIMARY KEY CHECK (length(id_hash) = 32),
    user_id       uuid NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    auth_method   text NOT NULL CHECK (auth_method IN ('password')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at  timestamptz NOT NULL DEFAULT now(),
    -- the absolute end, fixed at sign-in; the idle limit is applied at read time from settings
    expires_at    timestamptz NOT NULL,
    revoked_at    timestamptz
);
-- "Sign this user out everywhere" (set-password, sign-out) and the per-user clean-up at sign-in.
CREATE INDEX web_sessions_user_idx ON web_sessions (user_id);

-- The API's principal: a bearer token, its user and that user's membership in the URL's
-- organization, in the one statement that opens a request's transaction (it also scopes it). The
-- web role reads api_tokens only through this function: never a list of token hashes.
CREATE FUNCTION api_principal(p_token_hash bytea, p_organization_id uuid)
RETURNS TABLE (user_id uuid, email text, name text, is_operator boolean,
               organization_id uuid, organization_name text, organization_state text, role text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT u.id, u.email, u.name, u.is_operator, o.id, o.name, o.state, m.role
    FROM api_tokens t
    JOIN users u ON u.id = t.user_id
    LEFT JOIN memberships m ON m.user_id = u.id AND m.organization_id = p_organization_id
    LEFT JOIN organizations o ON o.id = m.organization_id
    WHERE t.token_hash = p_token_hash AND t.revoked_at IS NULL
$$;

-- =============================================================================================
-- Operations: worker presence, kind controls, operator audit, metric counters
-- =============================================================================================

-- One row per worker process (a Celery pool child, or the main process of a solo pool). The
-- dashboard calls it offline after a documented silence; nothing here is tenant data.
CREATE TABLE worker_processes (
    id             text PRIMARY KEY,            -- '<host>:<pid>', as in jobs.leased_by
    node           text NOT NULL,               -- the Celery node name
    hostname       text NOT NULL,
    pid            integer NOT NULL,
    version        text NOT NULL,
    queues         text[] NOT NULL DEFAULT '{}',
    kinds          text[] NOT NULL DEFAULT '{}',
    concurrency    integer NOT NULL DEFAULT 1,
    running        integer NOT NULL DEFAULT 0,
    processed      bigint NOT NULL DEFAULT 0,
    failed         bigint NOT NULL DEFAULT 0,
    started_at     timestamptz NOT NULL DEFAULT now(),
    last_seen_at   timestamptz NOT NULL DEFAULT now(),
    stopped_at     timestamptz
);
-- Workers seen recently: the dashboard's list and /metrics' online count (ops/*.sql workers).
CREATE INDEX worker_processes_seen_idx ON worker_processes (last_seen_at);

-- Operator controls per kind, honoured by every claim on every host.
CREATE TABLE kind_settings (
    kind               text PRIMARY KEY,
    paused             boolean NOT NULL DEFAULT false,
    concurrency_limit  integer CHECK (concurrency_limit IS NULL OR concurrency_limit >= 0),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    updated_by         uuid REFERENCES users (id)
);

CREATE TABLE operator_audit (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    operator_id  uuid NOT NULL REFERENCES users (id),
    action       text NOT NULL,
    target       text NOT NULL,
    detail       jsonb NOT NULL DEFAULT '{}',
    request_id   text,
    at           timestamptz NOT NULL DEFAULT now()
);
-- The dashboard's audit log, newest first (ops/dashboard.sql audit).
CREATE INDEX operator_audit_at_idx ON operator_audit (at DESC);

-- Prometheus counters must never go down, and retention deletes jobs: so finished-job counts
-- and histogram observations are recorded as jobs move. Recording is an append-only INSERT into
-- metric_events (no shared row to lock, so two claims never wait on each other's counters); the
-- sweeper folds them into metric_counters in bounded batches, and /metrics adds both.
CREATE TABLE metric_events (
    id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name   text NOT NULL,
    kind   text NOT NULL,
    label  text NOT NULL DEFAULT '',
    value  double precision NOT NULL
);

CREATE TABLE metric_counters (
    name    text NOT NULL,
    kind    text NOT NULL,
    label   text NOT NULL DEFAULT '',
    value   double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (name, kind, label)
);

-- =============================================================================================
-- Metric functions
-- =============================================================================================

-- Owner-only (no grant): reached through count_event().
CREATE FUNCTION bump_metric(p_name text, p_kind text, p_label text, p_by double precision)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO metric_events (name, kind, label, value) VALUES (p_name, p_kind, p_label, p_by)
$$;

-- Histogram bucket bounds (seconds), shared by queue-wait and duration (and models/ops/metrics.py).
CREATE FUNCTION metric_buckets() RETURNS double precision[] LANGUAGE sql IMMUTABLE AS
$$ SELECT ARRAY[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800]::double precision[] $$;

-- The bucket label of a value: the smallest bound that holds it (stored per bucket, not
-- cumulatively; /metrics accumulates on read). A plain CASE, because an SQL function made of
-- one expression is inlined into the statement that calls it: the batch triggers call it per
-- row. The bounds are metric_buckets()'s, which a test checks one by one.
CREATE FUNCTION metric_bucket(seconds double precision) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN seconds IS NULL THEN NULL
        WHEN seconds <= 0.005 THEN '0.005' WHEN seconds <= 0.01 THEN '0.01'
        WHEN seconds <= 0.025 THEN '0.025' WHEN seconds <= 0.05 THEN '0.05'
        WHEN seconds <= 0.1 THEN '0.1' WHEN seconds <= 0.25 THEN '0.25'
        WHEN seconds <= 0.5 THEN '0.5' WHEN seconds <= 1 THEN '1'
        WHEN seconds <= 2.5 THEN '2.5' WHEN seconds <= 5 THEN '5'
        WHEN seconds <= 10 THEN '10' WHEN seconds <= 30 THEN '30'
        WHEN seconds <= 60 THEN '60' WHEN seconds <= 300 THEN '300'
        WHEN seconds <= 1800 THEN '1800'
        ELSE '+Inf' END
$$;

-- The sweeper's fold of metric_events into metric_counters, in bounded batches. SECURITY
-- DEFINER: the worker may neither read nor delete metric_events itself.
CREATE FUNCTION fold_metric_events(batch integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    folded integer;
BEGIN
    WITH taken AS (
        DELETE FROM metric_events WHERE id IN (
            SELECT id FROM metric_events ORDER BY id LIMIT batch FOR UPDATE SKIP LOCKED)
        RETURNING name, kind, label, value
    ), summed AS (
        SELECT name, kind, label, sum(value) AS value, count(*) AS n FROM taken
        GROUP BY name, kind, label
    ), upserted AS (
        INSERT INTO metric_counters (name, kind, label, value)
        SELECT name, kind, label, value FROM summed
        ON CONFLICT (name, kind, label) DO UPDATE SET value = metric_counters.value + excluded.value
        RETURNING 1
    )
    -- A data-modifying CTE runs to completion whether or not it is read.
    SELECT coalesce(sum(n), 0) INTO folded FROM summed;
    RETURN folded;
END $$;

-- Counters bumped from Python (stale finishes fenced, wake-ups published or failed) go
-- through this one narrow door: three names, a positive finite amount (a flush's sum), a
-- kind's name or none. A caller cannot make a counter go down (every rate() would read a
-- reset), poison it with NaN or Infinity, or grow its labels with free text.
CREATE FUNCTION count_event(p_name text, p_kind text, p_by double precision)
RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT bump_metric(p_name, p_kind, '', p_by)
    WHERE p_name IN ('spacejobs_stale_finishes_fenced_total', 'spacejobs_wakeups_published_total',
                     'spacejobs_wakeups_failed_total')
      AND p_by > 0 AND p_by <= 1e9
      AND (p_kind = '' OR p_kind ~ '^[a-z][a-z0-9_.]{0,63}$')
$$;

-- =============================================================================================
-- Job triggers: transitions are enforced here, whatever client writes the row
-- =============================================================================================

CREATE FUNCTION jobs_check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IN ('completed', 'failed', 'cancelled') THEN
        -- Terminal rows stay frozen, with one exception: retention may drop the result.
        IF NEW.result_expired_at IS NOT NULL AND OLD.result_expired_at IS NULL
           AND NEW.result IS NULL AND NEW.result_ref IS NULL THEN
            NEW := OLD;
            NEW.result := NULL;
            NEW.result_ref := NULL;
            NEW.result_expired_at := now();
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'job % is % and can no longer change', OLD.id, OLD.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.organization_id <> OLD.organization_id OR NEW.requested_by <> OLD.requested_by
       OR NEW.kind <> OLD.kind OR NEW.params <> OLD.params THEN
        RAISE EXCEPTION 'job % snapshot is immutable', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status <> OLD.status AND NOT (
           (OLD.status = 'queued' AND NEW.status IN ('leased', 'cancelled'))
        OR (OLD.status = 'leased' AND NEW.status IN ('completed', 'failed', 'queued', 'cancel_requested'))
        OR (OLD.status = 'cancel_requested' AND NEW.status IN ('cancelled', 'completed', 'failed'))
    ) THEN
        RAISE EXCEPTION 'job % cannot go from % to %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF current_user = 'space_app' AND NOT (
           (OLD.status = 'queued' AND NEW.status = 'cancelled')
        OR (OLD.status = 'leased' AND NEW.status = 'cancel_requested')) THEN
        RAISE EXCEPTION 'the web may only cancel a job' USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- A live lease is only replaced once it has expired: fencing in the database itself.
    IF OLD.status = 'leased' AND NEW.status = 'leased'
       AND NEW.lease_token IS DISTINCT FROM OLD.lease_token AND OLD.lease_until > now() THEN
        RAISE EXCEPTION 'job % is leased until %', OLD.id, OLD.lease_until
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status IN ('completed', 'failed', 'cancelled') THEN
        NEW.finished_at := coalesce(NEW.finished_at, now());
        NEW.lease_token := NULL;
        NEW.lease_until := NULL;
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END $$;

CREATE TRIGGER jobs_check_transition BEFORE UPDATE ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_check_transition();

-- Adds the jobs that became active (+1) or stopped being active (-1), one entry per job, to
-- active_job_counts, summed per (organization, kind). The rows written are the calling
-- transaction's slot's: the first of 64 advisory locks it can take (or already holds), held
-- until it ends, so no other transaction writes those rows meanwhile and nobody waits on them.
-- Only with all 64 held by other writers does it share slot pid % 64, whose row locks then
-- order the writers. Called by the jobs triggers only (as the owner).
CREATE FUNCTION add_active_jobs(p_organization_ids uuid[], p_kinds text[], p_deltas integer[])
RETURNS void LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
DECLARE
    slots CONSTANT integer := 64;
    lock_key CONSTANT integer := hashtext('spacejobs.active_job_counts');
    orgs uuid[];
    kinds text[];
    deltas bigint[];
    mine integer;
BEGIN
    -- A claim or a heartbeat moves jobs between active statuses: nothing to add, no slot taken.
    SELECT array_agg(d.organization_id ORDER BY d.organization_id, d.kind),
           array_agg(d.kind ORDER BY d.organization_id, d.kind),
           array_agg(d.delta ORDER BY d.organization_id, d.kind)
    INTO orgs, kinds, deltas
    FROM (SELECT u.organization_id, u.kind, sum(u.delta) AS delta
          FROM unnest(p_organization_ids, p_kinds, p_deltas) AS u (organization_id, kind, delta)
          GROUP BY u.organization_id, u.kind
          HAVING sum(u.delta) <> 0) AS d;
    IF orgs IS NULL THEN
        RETURN;
    END IF;
    FOR i IN 0 .. slots - 1 LOOP
        IF pg_try_advisory_xact_lock(lock_key, i) THEN
            mine := i;
            EXIT;
        END IF;
    END LOOP;
    INSERT INTO active_job_counts AS c (organization_id, kind, slot, active)
    SELECT d.organization_id, d.kind, coalesce(mine, pg_backend_pid() % slots), d.delta
    FROM unnest(orgs, kinds, deltas) WITH ORDINALITY AS d (organization_id, kind, delta, ord)
    ORDER BY d.ord
    ON CONFLICT (organization_id, kind, slot) DO UPDATE SET active = c.active + excluded.active;
END $$;

-- The counts again from the jobs themselves, for a database whose rows were written with the
-- triggers disabled (pg_restore --disable-triggers). The owner runs it; writers wait meanwhile.
CREATE FUNCTION recount_active_jobs() RETURNS void
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    LOCK TABLE jobs IN SHARE MODE;
    LOCK TABLE active_job_counts IN EXCLUSIVE MODE;
    DELETE FROM active_job_counts;
    INSERT INTO active_job_counts (organization_id, kind, slot, active)
    SELECT j.organization_id, j.kind, 0, count(*) FROM jobs j
    WHERE j.status IN ('queued', 'leased', 'cancel_requested')
    GROUP BY j.organization_id, j.kind;
END $$;

-- Inserted jobs: their 'queued' events, and one NOTIFY per statement for workers that LISTEN
-- (a wake-up faster than the broker's; the broker's wake-up and the sweeper remain the
-- guarantee, NOTIFY is only a shortcut). The actor defaults to the requester.
-- SECURITY DEFINER: job_events is written by this function only, whoever inserted the job.
CREATE FUNCTION jobs_after_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    -- Whatever a session of an application role inserts (through our functions, the only way
    -- it can) is checked; the owner's administrative sessions (a restore, test set-ups that
    -- plant finished rows) are not.
    IF session_user IN ('space_app', 'space_worker', 'space_operator') AND EXISTS (
               SELECT 1 FROM new_jobs n
               WHERE n.status <> 'queued' OR n.attempts <> 0 OR n.lease_token IS NOT NULL
                  OR n.lease_until IS NOT NULL OR n.leased_by IS NOT NULL OR n.result IS NOT NULL
                  OR n.result_ref IS NOT NULL OR n.started_at IS NOT NULL
                  OR n.finished_at IS NOT NULL OR n.error_code IS NOT NULL) THEN
        RAISE EXCEPTION 'a job is born queued, at attempt 0, with no lease and no result'
            USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO job_events (job_id, organization_id, from_status, to_status, attempt, actor)
    SELECT n.id, n.organization_id, NULL, n.status, n.attempts,
           coalesce(nullif(current_setting('app.actor', true), ''), 'user:' || n.requested_by)
    FROM new_jobs n;
    IF FOUND THEN
        PERFORM pg_notify('spacejobs_jobs', '');
    END IF;
    PERFORM add_active_jobs(array_agg(n.organization_id), array_agg(n.kind), array_agg(1))
    FROM new_jobs n WHERE n.status IN ('queued', 'leased', 'cancel_requested');
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_after_insert AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_after_insert();

-- Updated jobs: an event per status change (and per re-lease after expiry, which is a new
-- attempt), and the metric events, summed per statement: a batch of 100 finishes adds one
-- 'finished' row with value 100, not 100 rows. Jobs that stop being active leave
-- active_job_counts in the same statement.
CREATE FUNCTION jobs_after_update() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
-- PL/pgSQL keeps each statement's first plan for the session, and a transition table has no
-- statistics: a plan made for a one-row update joined new_jobs to old_jobs by nested loop ever
-- after, comparing every new row with every old one (revision 0022). Hash joins instead, and
-- no JIT: the cost of the LATERAL's nested loop, disabled but still the only way, would pass
-- jit_above_cost and LLVM would compile the metrics statement on every call (~300 ms).
SET enable_nestloop = off SET jit = off AS $$
BEGIN
    INSERT INTO job_events (job_id, organization_id, from_status, to_status, attempt, actor)
    SELECT n.id, n.organization_id, o.status, n.status, n.attempts,
           coalesce(nullif(current_setting('app.actor', true), ''), current_user)
    FROM new_jobs n JOIN old_jobs o ON o.id = n.id
    WHERE n.status <> o.status OR n.attempts <> o.attempts;

    INSERT INTO metric_events (name, kind, label, value)
    SELECT m.name, t.kind, m.label, sum(m.value)
    FROM (
        SELECT n.kind,
               -- queue wait: created -> first lease; duration: first lease -> finish
               CASE WHEN o.status = 'queued' AND n.status = 'leased' AND o.attempts = 0
                    THEN extract(epoch FROM clock_timestamp() - n.created_at) END AS wait_s,
               CASE WHEN n.status IN ('completed', 'failed', 'cancelled') AND n.status <> o.status
                         AND n.started_at IS NOT NULL
                    THEN extract(epoch FROM clock_timestamp() - n.started_at) END AS run_s,
               CASE WHEN n.status IN ('completed', 'failed', 'cancelled') AND n.status <> o.status
                    THEN n.status END AS finished_as,
               o.status IN ('leased', 'cancel_requested') AND o.lease_until < now()
                   AND (n.status <> o.status OR n.lease_token IS DISTINCT FROM o.lease_token) AS expired
        FROM new_jobs n JOIN old_jobs o ON o.id = n.id
        WHERE n.status <> o.status OR n.attempts <> o.attempts
    ) AS t
    CROSS JOIN LATERAL (VALUES
        ('spacejobs_job_queue_wait_seconds_bucket', metric_bucket(t.wait_s), 1.0, t.wait_s IS NOT NULL),
        ('spacejobs_job_queue_wait_seconds_sum', '', t.wait_s, t.wait_s IS NOT NULL),
        ('spacejobs_jobs_finished_total', t.finished_as, 1.0, t.finished_as IS NOT NULL),
        ('spacejobs_job_duration_seconds_bucket', metric_bucket(t.run_s), 1.0, t.run_s IS NOT NULL),
        ('spacejobs_job_duration_seconds_sum', '', t.run_s, t.run_s IS NOT NULL),
        ('spacejobs_leases_expired_total', '', 1.0, t.expired)
    ) AS m (name, label, value, wanted)
    WHERE m.wanted
    GROUP BY m.name, t.kind, m.label;

    PERFORM add_active_jobs(array_agg(c.organization_id), array_agg(c.kind), array_agg(c.delta))
    FROM (SELECT o.organization_id, o.kind, -1 AS delta FROM old_jobs o
          WHERE o.status IN ('queued', 'leased', 'cancel_requested')
          UNION ALL
          SELECT n.organization_id, n.kind, 1 FROM new_jobs n
          WHERE n.status IN ('queued', 'leased', 'cancel_requested')) AS c;

    -- Jobs that just ended, for whoever waits on them (models/jobs/waiting.py): their ids, at
    -- most 200 to a notification (a payload holds 8,000 bytes). Delivered at COMMIT, like the
    -- row itself; a waiter re-reads the row, the truth, in any case.
    PERFORM pg_notify('spacejobs_finished', chunk.ids)
    FROM (SELECT string_agg(e.id::text, ',') AS ids
          FROM (SELECT n.id, (row_number() OVER ()) / 200 AS part
                FROM new_jobs n JOIN old_jobs o ON o.id = n.id
                WHERE n.status IN ('completed', 'failed', 'cancelled') AND n.status <> o.status) e
          GROUP BY e.part) AS chunk;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_after_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_after_update();

-- A job's events and its count as active go with it: retention, an organization's deletion
-- (cascading to its jobs), TRUNCATE.
CREATE FUNCTION jobs_after_delete() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    DELETE FROM job_events e USING gone_jobs g WHERE e.job_id = g.id;
    PERFORM add_active_jobs(array_agg(g.organization_id), array_agg(g.kind), array_agg(-1))
    FROM gone_jobs g WHERE g.status IN ('queued', 'leased', 'cancel_requested');
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_after_delete AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS gone_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_after_delete();

CREATE FUNCTION jobs_after_truncate() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    TRUNCATE job_events;
    TRUNCATE active_job_counts;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_after_truncate AFTER TRUNCATE ON jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_after_truncate();

-- The requester's standing for jobs the caller holds the lease of: the membership role and the
-- organization's state, read as the owner (the worker role may not read memberships across
-- organizations) and only for rows whose lease token the caller presents. FOR SHARE holds the
-- membership and the organization still until the caller commits: a removal or a state change
-- waits for the job's write to commit, instead of slipping in between the check and the write.
-- A job missing from the result has no membership left (or the lease is no longer the caller's;
-- the fenced write that follows tells those apart).
-- Each (organization, requester) pair is locked once, however many of its jobs are in the batch.
CREATE FUNCTION lease_standing(p_ids uuid[], p_tokens uuid[])
RETURNS TABLE (job_id uuid, role text, organization_state text)
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    WITH held AS (
        SELECT j.id, j.organization_id, j.requested_by
        FROM unnest(p_ids, p_tokens) AS l (id, token)
        JOIN jobs j ON j.id = l.id AND j.lease_token = l.token
                   AND j.status IN ('leased', 'cancel_requested')
        WHERE j.id = ANY (p_ids)
    ), standing AS (
        SELECT m.organization_id, m.user_id, m.role, o.state
        FROM memberships m JOIN organizations o ON o.id = m.organization_id
        WHERE (m.organization_id, m.user_id) IN (SELECT organization_id, requested_by FROM held)
        FOR SHARE OF m, o
    )
    SELECT h.id, s.role, s.state
    FROM held h
    JOIN standing s ON s.organization_id = h.organization_id AND s.user_id = h.requested_by
$$;

-- The claim: up to p_limit due jobs in ONE statement, each with its own fresh random lease token,
-- fair between organizations: they are taken in turn around a ring (the caller remembers where
-- its last claim stopped), each a share of the batch in proportion to its weight, and within an
-- organization higher priority first. Every step reads an index (jobs_fair_claim_idx; leases
-- that ran out, jobs_lease_expiry_idx); SKIP LOCKED lets concurrent claimers pass each other.
-- A function, because it is the one place a worker reads params: those of the jobs it leases.
CREATE FUNCTION claim_jobs(p_worker text, p_limit integer, p_skip_kinds text[], p_only_kind text,
                           p_after_organization uuid)
RETURNS TABLE (id uuid, organization_id uuid, requested_by uuid, kind text, params jsonb,
               attempts integer, max_attempts integer, lease_token uuid, lease_seconds integer,
               request_id text, more_due boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
-- JIT compiled this short statement on every call once the queue was large (revision 0016).
-- Every read below has an index made for it, so no sequential or bitmap scan, and a plan of
-- those indexes does not depend on the statistics: one generic plan a session. Without this a
-- claim behind 1,000,000 finished rows took 80 ms instead of 1 (revision 0023).
SET jit = off SET enable_seqscan = off SET enable_bitmapscan = off
SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
    WITH RECURSIVE
    -- The ring of organizations with queued jobs, from just after p_after_organization round to
    -- it again: a loose index scan, one probe per organization. At least 32 of them even for a
    -- small batch, so that concurrent claimers whose first organizations' jobs are locked by
    -- each other (SKIP LOCKED) still find the next ones'.
    after_cursor (org, n) AS (
        SELECT (SELECT q.organization_id FROM jobs q
                WHERE q.status = 'queued' AND q.organization_id > p_after_organization
                ORDER BY q.organization_id LIMIT 1), 1
        UNION ALL
        SELECT (SELECT q.organization_id FROM jobs q
                WHERE q.status = 'queued' AND q.organization_id > a.org
                ORDER BY q.organization_id LIMIT 1), a.n + 1
        FROM after_cursor a WHERE a.org IS NOT NULL AND a.n < greatest(p_limit, 32)
    ), from_start (org, n) AS (
        SELECT (SELECT q.organization_id FROM jobs q WHERE q.status = 'queued'
                ORDER BY q.organization_id LIMIT 1), 1
        UNION ALL
        SELECT (SELECT q.organization_id FROM jobs q
                WHERE q.status = 'queued' AND q.organization_id > f.org
                ORDER BY q.organization_id LIMIT 1), f.n + 1
        FROM from_start f
        WHERE f.org IS NOT NULL AND f.org < p_after_organization AND f.n < greatest(p_limit, 32)
    ), ring AS (
        SELECT r.org, r.position FROM (
            SELECT a.org, a.n AS position FROM after_cursor a WHERE a.org IS NOT NULL
            UNION ALL
            SELECT f.org, greatest(p_limit, 32) + f.n FROM from_start f
            WHERE f.org IS NOT NULL AND f.org <= p_after_organization
        ) AS r
        ORDER BY r.position
        LIMIT greatest(p_limit, 32)
    ), shares AS (
        -- Each organization's share of the batch, in proportion to its weight (at least one).
        SELECT r.org, r.position, o.claim_weight AS weight,
               ceil(p_limit * o.claim_weight::numeric / sum(o.claim_weight) OVER ())::integer
                   AS share
        FROM ring r JOIN organizations o ON o.id = r.org
    ), queued AS (
        SELECT s.position, s.weight, c.ctid, c.priority, c.run_after, c.created_at
        FROM shares s CROSS JOIN LATERAL (
            SELECT q.ctid, q.priority, q.run_after, q.created_at FROM jobs q
            WHERE q.organization_id = s.org AND q.status = 'queued' AND q.run_after <= now()
              AND q.kind <> ALL (p_skip_kinds) AND (p_only_kind IS NULL OR q.kind = p_only_kind)
            ORDER BY q.priority DESC, q.run_after, q.created_at
            LIMIT s.share
            FOR UPDATE OF q SKIP LOCKED
        ) AS c
    ), interleaved AS (
        -- Round by round: each organization's next job(s), a weight of 2 taking two per round.
        SELECT i.ctid FROM (
            SELECT q.ctid, q.position,
                   row_number() OVER (PARTITION BY q.position
                                      ORDER BY q.priority DESC, q.run_after, q.created_at)
                       ::numeric / q.weight AS round
            FROM queued q
        ) AS i
        ORDER BY i.round, i.position
        LIMIT p_limit
    ), expired AS (
        -- A lease that ran out while attempts remain is claimable at once (the sweeper would
        -- otherwise requeue it a little later); cancel_requested is not: an expired cancel
        -- request ends cancelled, never retried.
        SELECT e.ctid FROM jobs e
        WHERE e.status = 'leased' AND e.lease_until < now() AND e.attempts < e.max_attempts
          AND e.kind <> ALL (p_skip_kinds) AND (p_only_kind IS NULL OR e.kind = p_only_kind)
        ORDER BY e.lease_until
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), chosen AS (
        SELECT c.ctid FROM (SELECT x.ctid FROM expired x UNION ALL SELECT y.ctid FROM interleaved y)
            AS c
        LIMIT p_limit
    )
    UPDATE jobs j
    SET status = 'leased', lease_token = gen_random_uuid(), leased_by = p_worker,
        lease_until = clock_timestamp() + j.lease_seconds * interval '1 second',
        attempts = j.attempts + 1, started_at = coalesce(j.started_at, now())
    -- By the row versions the CTEs locked (FOR UPDATE: nobody else can move them before this
    -- UPDATE), a TID scan: no second probe of jobs_pkey per job (revision 0017).
    WHERE j.ctid = ANY (ARRAY(SELECT chosen.ctid FROM chosen))
    RETURNING j.id, j.organization_id, j.requested_by, j.kind, j.params, j.attempts,
              j.max_attempts, j.lease_token, j.lease_seconds, j.request_id,
              -- whether more was due than this claim took (as of its start): the claimer then
              -- tells another process, since wake-ups are coalesced
              (SELECT count(*) > p_limit FROM (
                  SELECT 1 FROM jobs m WHERE m.status = 'queued' AND m.run_after <= now()
                  LIMIT p_limit + 1) AS due);
    IF NOT FOUND THEN
        -- Nothing taken: one row with no job says whether jobs were due all the same (locked
        -- by concurrent claimers for a moment), so the caller may try again instead of idling.
        RETURN QUERY SELECT NULL::uuid, NULL::uuid, NULL::uuid, NULL::text, NULL::jsonb,
                            NULL::integer, NULL::integer, NULL::uuid, NULL::integer, NULL::text,
                            EXISTS (SELECT 1 FROM jobs m
                                    WHERE m.status = 'queued' AND m.run_after <= now()
                                      AND m.kind <> ALL (p_skip_kinds)
                                      AND (p_only_kind IS NULL OR m.kind = p_only_kind));
    END IF;
END $$;

-- =============================================================================================
-- Durable fan-out: a parent job's children, made and read by the worker holding its lease
-- =============================================================================================

-- Children, for the worker holding the PARENT's lease: they belong to the parent's organization
-- and requester (taken from the parent's row, never from the caller), are born queued like any
-- job, and the places already taken are skipped. Returns how many were created.
CREATE FUNCTION spawn_children(p_parent uuid, p_token uuid, p_kind text, p_indexes integer[],
                               p_params jsonb[], p_max_attempts integer, p_lease_seconds integer)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    parent jobs;
    created integer;
BEGIN
    SELECT * INTO parent FROM jobs j
    WHERE j.id = p_parent AND j.lease_token = p_token AND j.status = 'leased';
    IF NOT FOUND THEN
        -- The lease is no longer the caller's (a newer attempt spawns, not this one), or a
        -- cancel was asked for: nothing new starts under a parent that is stopping.
        RETURN 0;
    END IF;
    INSERT INTO jobs (organization_id, requested_by, kind, params, max_attempts, lease_seconds,
                      request_id, parent_id, child_index)
    SELECT parent.organization_id, parent.requested_by, p_kind, c.params,
           least(greatest(p_max_attempts, 1), 100), least(greatest(p_lease_seconds, 1), 86400),
           parent.request_id, parent.id, c.place
    FROM unnest(p_indexes, p_params) AS c (place, params)
    ON CONFLICT (parent_id, child_index) WHERE parent_id IS NOT NULL DO NOTHING;
    GET DIAGNOSTICS created = ROW_COUNT;
    RETURN created;
END $$;

-- The children of a parent whose lease the caller holds, in place order, with their results:
-- a parent reads what its own children produced, in its own organization, and nothing else.
CREATE FUNCTION children_of(p_parent uuid, p_token uuid)
RETURNS TABLE (child_index integer, id uuid, status text, result jsonb, error_code text,
               error_message text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT c.child_index, c.id, c.status, c.result, c.error_code, c.error_message
    FROM jobs p JOIN jobs c ON c.parent_id = p.id
    WHERE p.id = p_parent AND p.lease_token = p_token AND p.status IN ('leased', 'cancel_requested')
    ORDER BY c.child_index
$$;

-- A cancelled parent's children: queued ones end at once, running ones are asked to stop, as a
-- user's cancel would. For the worker holding the parent's lease. Returns how many it touched.
CREATE FUNCTION cancel_children(p_parent uuid, p_token uuid) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    touched integer;
BEGIN
    UPDATE jobs c
    SET status = CASE WHEN c.status = 'queued' THEN 'cancelled' ELSE 'cancel_requested' END,
        cancel_requested_at = now(), cancel_requested_by = p.cancel_requested_by
    FROM jobs p
    WHERE p.id = p_parent AND p.lease_token = p_token
      AND p.status IN ('leased', 'cancel_requested')
      AND c.parent_id = p.id AND c.status IN ('queued', 'leased');
    GET DIAGNOSTICS touched = ROW_COUNT;
    RETURN touched;
END $$;

-- =============================================================================================
-- Submits: one statement checks the requester's standing and writes the job
-- =============================================================================================

-- SECURITY DEFINER: these functions write as the owner whatever the caller's scope, so they
-- check the membership themselves (held FOR SHARE until commit). The rules they apply come from
-- the caller's code (the kind's allowed organization states and least role), as the requester
-- comes from the authenticated context. A job is only ever born the way they make it: queued,
-- attempt 0, no lease, no result, bounded attempts and lease.

-- Quotas: how many active jobs an organization, or a kind of it, may have.

-- How many active jobs the organization (p_kind NULL) or one kind of it has, as committed when
-- the calling statement began: the sum of its rows in active_job_counts, a few rows whatever
-- the number of jobs. PL/pgSQL rather than SQL, because it keeps the statement's plan for the
-- session: every submit calls it.
CREATE FUNCTION active_jobs(p_organization_id uuid, p_kind text)
RETURNS bigint LANGUAGE plpgsql STABLE SET search_path = public, pg_temp AS $$
BEGIN
    RETURN (SELECT coalesce(sum(c.active), 0) FROM active_job_counts c
            WHERE c.organization_id = p_organization_id AND (p_kind IS NULL OR c.kind = p_kind));
END $$;

-- The cap that refuses p_kinds (one entry per job about to be written) when `margin` more jobs
-- than these may still appear unseen: ('', cap) for the organization's, (kind, cap) for a
-- kind's, no row when every cap leaves room. p_kind_caps are the kinds' declared quotas
-- (NULL: none), p_org_cap the default; the operators' rows in job_quotas win over both.
CREATE FUNCTION quota_refusal(p_organization_id uuid, p_kinds text[], p_kind_caps integer[],
                              p_org_cap integer, margin integer)
RETURNS TABLE (refused_kind text, cap integer)
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
DECLARE
    wanted record;
BEGIN
    FOR wanted IN
        -- the organization first, then each kind of the batch once
        SELECT '' AS kind, cardinality(p_kinds) AS n,
               coalesce((SELECT q.max_active FROM job_quotas q
                         WHERE q.organization_id = p_organization_id AND q.kind = ''),
                        p_org_cap) AS cap, 0 AS ord
        UNION ALL
        SELECT k.kind, count(*)::integer,
               coalesce(max(q.max_active), max(k.cap)), 1
        FROM unnest(p_kinds, p_kind_caps) AS k (kind, cap)
        LEFT JOIN job_quotas q ON q.organization_id = p_organization_id AND q.kind = k.kind
        GROUP BY k.kind
        ORDER BY ord, kind
    LOOP
        CONTINUE WHEN wanted.cap IS NULL;
        IF active_jobs(p_organization_id, nullif(wanted.kind, '')) + wanted.n + margin
           > wanted.cap THEN
            RETURN QUERY SELECT wanted.kind, wanted.cap;
            RETURN;
        END IF;
    END LOOP;
END $$;

-- May these jobs (p_kinds: one entry per job) be written? NULL when yes; else the cap that
-- refuses ('' for the organization's, or the kind's name) and its value. Exact: no interleaving
-- of concurrent submits, from any number of web processes, commits more active jobs than a cap.
--
-- Why not one lock per organization held until commit: it would make every submit of the
-- organization wait for the previous one's commit (its WAL flush), so one organization could
-- never submit faster than commits flush one by one. Instead the organization has STRIPES
-- advisory locks ("stripes"), each held until commit:
--
--   fast path, for a single job submitted by a transaction that had written nothing before
--   (p_first_write: it had no transaction id when the submit began): take ONE stripe (any free
--   one, else wait for one), then count; admitted when count + STRIPES <= cap. Submits on
--   different stripes run side by side.
--   slow path, for everything else (batches, a transaction's second write, or a count near
--   the cap): take ALL stripes in order (waiting for each fast submit in flight to commit or
--   roll back), then count; admitted when count + n <= cap.
--
-- Every count is a statement begun AFTER its locks (READ COMMITTED: each statement takes a new
-- snapshot), and a fast path that finds itself near the cap gives its stripe back by rolling
-- back the subtransaction that took it, so a waiting transaction never holds a stripe it took
-- for nothing.
--
-- Proof that no commit takes a cap past its value. Let A(t) be the organization's active jobs
-- committed at time t; a job only ever leaves the active set, so A grows only by commits of
-- submits. Take any moment τ and, among all admissions of transactions committed by τ, the
-- one whose count has the LATEST snapshot t_X; call its transaction X. A job active at τ was
-- either committed before t_X (then counted in A(t_X)) or written by a transaction Y committed
-- after t_X, all of whose admissions counted at or before t_X: Y was in flight at t_X, holding
-- the stripe(s) it took before its count(s), until its commit.
--   - X's admission was slow: X held every stripe at t_X, so no such Y other than X exists.
--     A(τ) <= (what X counted: A(t_X) plus X's own earlier jobs) + n_X <= cap.
--   - X's admission was fast: X held one stripe at t_X and had written nothing before, so
--     this is X's only job. A Y with a slow admission would have held every stripe at t_X,
--     X's included: impossible. So every Y made exactly one fast admission (a fast admission
--     is a transaction's first write, and any later one is slow, hence also at or before t_X:
--     impossible as just shown) of one job, holding its own stripe at t_X: at most STRIPES - 1
--     of them. A(τ) <= A(t_X) + 1 + (STRIPES - 1) <= cap, since X was admitted with
--     A(t_X) + STRIPES <= cap.
-- The same argument holds for each kind's count. It needs READ COMMITTED (checked below):
-- under REPEATABLE READ a count would see the transaction's first snapshot, taken before its
-- locks. Jobs the owner writes directly (a restore, test fixtures) are outside it.
--
-- A transaction that submits twice holds its first stripe while its second (slow) submit
-- waits for the others; should a fast submit meanwhile wait for it (inserting the same
-- dedup_key or Idempotency-Key), PostgreSQL's deadlock detector rolls one of them back whole:
-- nothing is written and it may be retried. The web never submits twice in one transaction.
CREATE FUNCTION admit_jobs(p_organization_id uuid, p_kinds text[], p_kind_caps integer[],
                           p_org_cap integer, p_first_write boolean)
RETURNS TABLE (refused_kind text, cap integer)
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
DECLARE
    stripes CONSTANT integer := 16;
    lock_key CONSTANT integer := hashtext('spacejobs.quota:' || p_organization_id::text);
    first_stripe integer;
    got boolean;
BEGIN
    IF p_org_cap IS NULL AND NOT EXISTS (SELECT 1 FROM unnest(p_kind_caps) c WHERE c IS NOT NULL)
       AND NOT EXISTS (SELECT 1 FROM job_quotas q WHERE q.organization_id = p_organization_id) THEN
        RETURN;  -- no cap applies: nothing to count
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'submitting jobs needs READ COMMITTED isolation (the quota counts what '
                        'committed before its locks)' USING ERRCODE = 'feature_not_supported';
    END IF;

    IF cardinality(p_kinds) = 1 AND p_first_write THEN
        BEGIN
            -- any free stripe; when all are taken, wait for a random one (holding no other)
            first_stripe := floor(random() * stripes)::integer;
            got := false;
            FOR i IN 0 .. stripes - 1 LOOP
                got := pg_try_advisory_xact_lock(lock_key, (first_stripe + i) % stripes);
                EXIT WHEN got;
            END LOOP;
            IF NOT got THEN
                PERFORM pg_advisory_xact_lock(lock_key, first_stripe);
            END IF;
            IF NOT EXISTS (SELECT 1 FROM quota_refusal(p_organization_id, p_kinds, p_kind_caps,
                                                       p_org_cap, stripes - 1)) THEN
                RETURN;  -- admitted; the subtransaction commits and the stripe is kept
            END IF;
            -- near a cap: roll the subtransaction back, which gives the stripe back
            RAISE EXCEPTION USING ERRCODE = 'SJQ01';
        EXCEPTION WHEN SQLSTATE 'SJQ01' THEN
            NULL;
        END;
    END IF;

    FOR i IN 0 .. stripes - 1 LOOP
        PERFORM pg_advisory_xact_lock(lock_key, i);
    END LOOP;
    RETURN QUERY SELECT r.refused_kind, r.cap
                 FROM quota_refusal(p_organization_id, p_kinds, p_kind_caps, p_org_cap, 0) AS r;
END $$;

CREATE FUNCTION role_rank(role text) RETURNS integer LANGUAGE sql IMMUTABLE AS $$
    SELECT array_position(ARRAY['member', 'admin', 'owner'], role)
$$;

-- outcome: 'created', 'replayed' (an Idempotency-Key seen before: the first job is answered,
-- whatever the quota), 'duplicate' (an active job has the dedup_key: its id is answered),
-- 'over_quota' (nothing written; quota_kind and quota_limit say which cap), or 'refused' (the
-- requester's role and the organization's state are answered, NULL for a non-member, so the
-- caller can say why in its own words).
CREATE FUNCTION submit_job(
    p_organization_id uuid, p_requested_by uuid, p_kind text, p_params jsonb,
    p_max_attempts integer, p_lease_seconds integer, p_org_states text[], p_role text,
    p_dedup_key text, p_idempotency_key text, p_request_id text, p_run_after timestamptz,
    p_retry_of uuid, p_org_quota integer, p_kind_quota integer, p_priority integer)
RETURNS TABLE (
    outcome text, member_role text, member_organization_state text,
    id uuid, organization_id uuid, requested_by uuid, kind text, status text, attempts integer,
    max_attempts integer, progress jsonb, error_code text, error_message text, dedup_key text,
    run_after timestamptz, created_at timestamptz, updated_at timestamptz,
    started_at timestamptz, finished_at timestamptz, cancel_requested_at timestamptz,
    leased_by text, lease_until timestamptz, result_expired_at timestamptz, params jsonb,
    quota_kind text, quota_limit integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    -- before the FOR SHARE below, which takes a transaction id without writing a job
    first_write CONSTANT boolean := pg_current_xact_id_if_assigned() IS NULL;
    standing record;
    refusal record;
    made jobs;
BEGIN
    SELECT m.role, o.state INTO standing
    FROM memberships m JOIN organizations o ON o.id = m.organization_id
    WHERE m.organization_id = p_organization_id AND m.user_id = p_requested_by
    FOR SHARE OF m, o;
    IF NOT FOUND OR standing.state <> ALL (p_org_states)
       OR role_rank(standing.role) < role_rank(p_role) THEN
        RETURN QUERY SELECT 'refused', standing.role, standing.state, NULL::uuid, NULL::uuid,
            NULL::uuid, NULL, NULL, NULL::integer, NULL::integer, NULL::jsonb, NULL, NULL, NULL,
            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
            NULL::timestamptz, NULL::timestamptz, NULL, NULL::timestamptz, NULL::timestamptz,
            NULL::jsonb, NULL, NULL::integer;
        RETURN;
    END IF;

    -- A replay answers the first job even at the cap: it asks for nothing new.
    IF p_idempotency_key IS NOT NULL THEN
        SELECT * INTO made FROM jobs j
        WHERE j.organization_id = p_organization_id AND j.requested_by = p_requested_by
          AND j.idempotency_key = p_idempotency_key;
    END IF;
    IF made.id IS NULL THEN
        SELECT * INTO refusal
        FROM admit_jobs(p_organization_id, ARRAY[p_kind], ARRAY[p_kind_quota], p_org_quota,
                        first_write);
        IF FOUND THEN
            RETURN QUERY SELECT 'over_quota', standing.role, standing.state, NULL::uuid,
                NULL::uuid, NULL::uuid, NULL, NULL, NULL::integer, NULL::integer, NULL::jsonb,
                NULL, NULL, NULL, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL, NULL::timestamptz,
                NULL::timestamptz, NULL::jsonb, refusal.refused_kind, refusal.cap;
            RETURN;
        END IF;

        INSERT INTO jobs (organization_id, requested_by, kind, params, max_attempts,
                          lease_seconds, dedup_key, idempotency_key, request_id, run_after,
                          retry_of, priority)
        VALUES (p_organization_id, p_requested_by, p_kind, p_params,
                least(greatest(p_max_attempts, 1), 100), least(greatest(p_lease_seconds, 1), 86400),
                p_dedup_key, p_idempotency_key, p_request_id, coalesce(p_run_after, now()),
                -- an operator's retry-as-new-job points back at the job it retries, in its org
                (SELECT r.id FROM jobs r WHERE r.id = p_retry_of
                                            AND r.organization_id = p_organization_id),
                -- out of range is the column CHECK's refusal, never a silent clamp
                coalesce(p_priority, 0))
        ON CONFLICT DO NOTHING
        RETURNING * INTO made;
        IF made.id IS NOT NULL THEN
            -- Who started it, for the organization's audit log: the scoped user (an operator's
            -- retry scopes the operator), else the requester.
            INSERT INTO org_audit (organization_id, actor_id, actor, action, job_id, detail,
                                   request_id)
            VALUES (p_organization_id, coalesce(app_user(), p_requested_by),
                    coalesce(app_actor(), 'user:' || p_requested_by), 'job.submit', made.id,
                    jsonb_strip_nulls(jsonb_build_object('kind', p_kind, 'retry_of', made.retry_of)),
                    p_request_id);
            RETURN QUERY SELECT 'created', standing.role, standing.state, made.id,
                made.organization_id, made.requested_by, made.kind, made.status, made.attempts,
                made.max_attempts, made.progress, made.error_code, made.error_message,
                made.dedup_key, made.run_after, made.created_at, made.updated_at,
                made.started_at, made.finished_at, made.cancel_requested_at, made.leased_by,
                made.lease_until, made.result_expired_at, made.params, NULL, NULL::integer;
            RETURN;
        END IF;

        -- A conflict: the same Idempotency-Key committed meanwhile, or an active duplicate.
        IF p_idempotency_key IS NOT NULL THEN
            SELECT * INTO made FROM jobs j
            WHERE j.organization_id = p_organization_id AND j.requested_by = p_requested_by
              AND j.idempotency_key = p_idempotency_key;
        END IF;
    END IF;
    IF made.id IS NULL THEN
        SELECT * INTO made FROM jobs j
        WHERE j.organization_id = p_organization_id AND j.kind = p_kind
          AND j.dedup_key = p_dedup_key AND j.status IN ('queued', 'leased', 'cancel_requested');
        -- The conflicting job may have ended in between: then there is nothing to name, and
        -- the caller may simply submit again.
    END IF;
    RETURN QUERY SELECT CASE WHEN p_idempotency_key IS NOT NULL AND made.idempotency_key
                                  IS NOT DISTINCT FROM p_idempotency_key
                             THEN 'replayed' ELSE 'duplicate' END,
        standing.role, standing.state, made.id,
        made.organization_id, made.requested_by, made.kind, made.status, made.attempts,
        made.max_attempts, made.progress, made.error_code, made.error_message,
        made.dedup_key, made.run_after, made.created_at, made.updated_at, made.started_at,
        made.finished_at, made.cancel_requested_at, made.leased_by, made.lease_until,
        made.result_expired_at, made.params, NULL, NULL::integer;
END $$;

-- The bulk submit: many jobs of the organization in one statement, ids made by the caller so
-- the answer keeps the request's order. The standing is checked once against the strictest
-- rules of the batch's kinds (every state they all allow, the highest role any needs): the
-- caller tells which item a refusal concerns. The whole batch is admitted against the caps or
-- none of it. A row that meets an active duplicate is skipped and missing from the answer; the
-- caller then rolls the batch back: all or nothing.
CREATE FUNCTION submit_jobs(
    p_organization_id uuid, p_requested_by uuid, p_org_states text[], p_role text,
    p_request_id text, p_ids uuid[], p_kinds text[], p_params jsonb[], p_max_attempts integer[],
    p_lease_seconds integer[], p_dedup_keys text[], p_run_afters timestamptz[],
    p_org_quota integer, p_kind_quotas integer[], p_priorities integer[])
RETURNS TABLE (
    outcome text, member_role text, member_organization_state text,
    id uuid, organization_id uuid, requested_by uuid, kind text, status text, attempts integer,
    max_attempts integer, progress jsonb, error_code text, error_message text, dedup_key text,
    run_after timestamptz, created_at timestamptz, updated_at timestamptz,
    started_at timestamptz, finished_at timestamptz, cancel_requested_at timestamptz,
    leased_by text, lease_until timestamptz, result_expired_at timestamptz, params jsonb,
    quota_kind text, quota_limit integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    standing record;
    refusal record;
BEGIN
    SELECT m.role, o.state INTO standing
    FROM memberships m JOIN organizations o ON o.id = m.organization_id
    WHERE m.organization_id = p_organization_id AND m.user_id = p_requested_by
    FOR SHARE OF m, o;
    IF NOT FOUND OR standing.state <> ALL (p_org_states)
       OR role_rank(standing.role) < role_rank(p_role) THEN
        RETURN QUERY SELECT 'refused', standing.role, standing.state, NULL::uuid, NULL::uuid,
            NULL::uuid, NULL, NULL, NULL::integer, NULL::integer, NULL::jsonb, NULL, NULL, NULL,
            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
            NULL::timestamptz, NULL::timestamptz, NULL, NULL::timestamptz, NULL::timestamptz,
            NULL::jsonb, NULL, NULL::integer;
        RETURN;
    END IF;
    SELECT * INTO refusal
    FROM admit_jobs(p_organization_id, p_kinds, p_kind_quotas, p_org_quota, false);
    IF FOUND THEN
        RETURN QUERY SELECT 'over_quota', standing.role, standing.state, NULL::uuid, NULL::uuid,
            NULL::uuid, NULL, NULL, NULL::integer, NULL::integer, NULL::jsonb, NULL, NULL, NULL,
            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
            NULL::timestamptz, NULL::timestamptz, NULL, NULL::timestamptz, NULL::timestamptz,
            NULL::jsonb, refusal.refused_kind, refusal.cap;
        RETURN;
    END IF;
    RETURN QUERY
    WITH made AS (
        INSERT INTO jobs AS j (id, organization_id, requested_by, kind, params, max_attempts,
                               lease_seconds, dedup_key, request_id, run_after, priority)
        SELECT n.id, p_organization_id, p_requested_by, n.kind, n.params,
               least(greatest(n.max_attempts, 1), 100), least(greatest(n.lease_seconds, 1), 86400),
               n.dedup_key, p_request_id, coalesce(n.run_after, now()), coalesce(n.priority, 0)
        FROM unnest(p_ids, p_kinds, p_params, p_max_attempts, p_lease_seconds, p_dedup_keys,
                    p_run_afters, p_priorities) AS n (id, kind, params, max_attempts,
                                                      lease_seconds, dedup_key, run_after,
                                                      priority)
        ON CONFLICT DO NOTHING
        RETURNING j.*
    ), audited AS (
        -- Who started each, for the organization's audit log (as in submit_job()).
        INSERT INTO org_audit (organization_id, actor_id, actor, action, job_id, detail,
                               request_id)
        SELECT p_organization_id, coalesce(app_user(), p_requested_by),
               coalesce(app_actor(), 'user:' || p_requested_by), 'job.submit', made.id,
               jsonb_build_object('kind', made.kind, 'bulk', true), p_request_id
        FROM made
    )
    SELECT 'created', standing.role, standing.state, made.id, made.organization_id,
        made.requested_by, made.kind, made.status, made.attempts, made.max_attempts,
        made.progress, made.error_code, made.error_message, made.dedup_key, made.run_after,
        made.created_at, made.updated_at, made.started_at, made.finished_at,
        made.cancel_requested_at, made.leased_by, made.lease_until, made.result_expired_at,
        made.params, NULL, NULL::integer
    FROM made;
END $$;

-- =============================================================================================
-- Retention
-- =============================================================================================

-- Retention is a policy the database holds: the ages below, which only the owner writes
-- (`spacejobs retention set`, and `spacejobs db upgrade` from SPACEJOBS_KEEP_*). The purge
-- functions read them; their caller, the sweeper as the worker role, chooses only a batch size,
-- so worker credentials cannot make history go sooner.
CREATE TABLE retention_policy (
    -- one row: the policy of this database
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    keep_jobs     interval NOT NULL DEFAULT interval '30 days' CHECK (keep_jobs > interval '0'),
    keep_results  interval NOT NULL DEFAULT interval '7 days' CHECK (keep_results > interval '0'),
    keep_events   interval NOT NULL DEFAULT interval '30 days' CHECK (keep_events > interval '0'),
    keep_audit    interval NOT NULL DEFAULT interval '365 days' CHECK (keep_audit > interval '0'),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
INSERT INTO retention_policy DEFAULT VALUES;

-- Finished jobs, their events and their results are deleted past the policy's ages, in bounded
-- batches, by the sweeper. As the owner (SECURITY DEFINER) because it must see every
-- organization's events, which the worker role may not read. A hostile caller chooses only the
-- batch (capped): it cannot make anything go sooner than the policy says, and it touches
-- nothing that is not finished (the transition trigger allows exactly one change to a finished
-- row: dropping its result). A result in the results store is a file the database cannot
-- delete: the keys of the files it let go come back in dropped_refs, and the sweeper deletes
-- those files once this has committed (the orphan sweep catches any it missed).
CREATE FUNCTION purge_finished_jobs(batch integer)
RETURNS TABLE (jobs_deleted integer, results_dropped integer, events_deleted integer,
               dropped_refs text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    policy retention_policy;
    n CONSTANT integer := least(greatest(batch, 0), 10000);
    refs_of_jobs text[];
    refs_of_results text[];
BEGIN
    SELECT * INTO STRICT policy FROM retention_policy;
    -- Whole jobs first: their events and diagnostics go with them.
    WITH old AS (
        SELECT id FROM jobs
        WHERE finished_at < now() - policy.keep_jobs AND status IN ('completed', 'failed', 'cancelled')
        ORDER BY finished_at LIMIT n
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs j USING old WHERE j.id = old.id RETURNING j.result_ref
    )
    SELECT count(*), array_agg(gone.result_ref) FILTER (WHERE gone.result_ref IS NOT NULL)
    INTO jobs_deleted, refs_of_jobs FROM gone;

    WITH old AS (
        SELECT id, result_ref FROM jobs
        WHERE finished_at < now() - policy.keep_results AND result IS NOT NULL
          AND result_expired_at IS NULL AND status IN ('completed', 'failed', 'cancelled')
        ORDER BY finished_at LIMIT n
        FOR UPDATE SKIP LOCKED
    ), dropped AS (
        UPDATE jobs j SET result = NULL, result_ref = NULL, result_expired_at = now()
        FROM old WHERE j.id = old.id RETURNING old.result_ref
    )
    SELECT count(*), array_agg(dropped.result_ref) FILTER (WHERE dropped.result_ref IS NOT NULL)
    INTO results_dropped, refs_of_results FROM dropped;

    WITH old AS (
        SELECT e.id FROM jobs j JOIN job_events e ON e.job_id = j.id
        WHERE j.finished_at < now() - policy.keep_events
          AND j.status IN ('completed', 'failed', 'cancelled')
        ORDER BY j.finished_at LIMIT n
    )
    DELETE FROM job_events e USING old WHERE e.id = old.id;
    GET DIAGNOSTICS events_deleted = ROW_COUNT;
    dropped_refs := coalesce(refs_of_jobs, '{}') || coalesce(refs_of_results, '{}');
    RETURN NEXT;
END $$;

-- The orphan sweep's two questions (models/results/sweep.py), asked as the owner because the
-- worker role may not read result_ref. Both take what the sweeper found in the store and answer
-- with nothing it did not know already: keys it listed itself, or job ids.
--
-- Which of these files a job still needs: its row references the file, or the job is running,
-- so the attempt that wrote it may still finish with it. A file is written before the fenced
-- finish that records it, and only a lease holder can finish: a file of a job that is not
-- running and does not reference it will never be referenced. Keys hold their job's id.
CREATE FUNCTION result_files_in_use(p_refs text[], p_job_ids uuid[]) RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT f.ref
    FROM unnest(p_refs, p_job_ids) AS f (ref, job_id)
    JOIN jobs j ON j.id = f.job_id
    WHERE j.result_ref = f.ref OR j.status IN ('leased', 'cancel_requested')
$$;

-- Jobs whose row references a file the store does not have (p_present: every key the sweeper
-- listed, starting at p_listed_at by the database's clock). Only jobs finished before the
-- listing began: their files were written before their finish, so the listing must have seen
-- them. Ids, never refs.
CREATE FUNCTION results_without_files(p_present text[], p_listed_at timestamptz)
RETURNS TABLE (job_id uuid, organization_id uuid, kind text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT j.id, j.organization_id, j.kind FROM jobs j
    WHERE j.result_ref IS NOT NULL AND j.finished_at < p_listed_at
      AND NOT EXISTS (SELECT 1 FROM unnest(p_present) AS p (ref) WHERE p.ref = j.result_ref)
$$;

-- The organizations' audit log: membership and state changes are written by these triggers,
-- whoever makes them (today the CLI, as the owner), in the same transaction. SECURITY DEFINER:
-- the log is written as the owner, whatever the writer's own grants. The actor is the scoped
-- user and actor, when our code set them.
CREATE FUNCTION memberships_audit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO org_audit (organization_id, actor_id, actor, action, member_id, detail)
        VALUES (NEW.organization_id, app_user(), coalesce(app_actor(), session_user),
                'member.add', NEW.user_id, jsonb_build_object('role', NEW.role));
    ELSIF TG_OP = 'UPDATE' THEN
        IF NEW.role IS DISTINCT FROM OLD.role THEN
            INSERT INTO org_audit (organization_id, actor_id, actor, action, member_id, detail)
            VALUES (NEW.organization_id, app_user(), coalesce(app_actor(), session_user),
                    'member.role_change', NEW.user_id,
                    jsonb_build_object('from', OLD.role, 'to', NEW.role));
        END IF;
    -- A membership deleted with its organization (ON DELETE CASCADE) leaves no entry: the
    -- organization's log goes with it.
    ELSIF EXISTS (SELECT 1 FROM organizations o WHERE o.id = OLD.organization_id) THEN
        INSERT INTO org_audit (organization_id, actor_id, actor, action, member_id, detail)
        VALUES (OLD.organization_id, app_user(), coalesce(app_actor(), session_user),
                'member.remove', OLD.user_id, jsonb_build_object('role', OLD.role));
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER memberships_audit AFTER INSERT OR DELETE OR UPDATE OF role ON memberships
    FOR EACH ROW EXECUTE FUNCTION memberships_audit();

CREATE FUNCTION organizations_audit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO org_audit (organization_id, actor_id, actor, action, detail)
    VALUES (NEW.id, app_user(), coalesce(app_actor(), session_user), 'organization.state_change',
            jsonb_build_object('from', OLD.state, 'to', NEW.state));
    RETURN NULL;
END $$;

CREATE TRIGGER organizations_audit AFTER UPDATE OF state ON organizations
    FOR EACH ROW WHEN (NEW.state IS DISTINCT FROM OLD.state)
    EXECUTE FUNCTION organizations_audit();

-- Retention of the audit log past the policy's age, in bounded batches, by the sweeper. As the
-- owner: no application role may delete an entry, and a caller chooses only the batch.
CREATE FUNCTION purge_org_audit(batch integer) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    WITH old AS (
        SELECT a.id FROM org_audit a
        WHERE a.at < now() - (SELECT p.keep_audit FROM retention_policy p)
        LIMIT least(greatest(batch, 0), 10000) FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM org_audit a USING old WHERE a.id = old.id RETURNING 1
    )
    SELECT count(*)::integer FROM gone
$$;

-- =============================================================================================
-- Row-level security
-- =============================================================================================
--
-- Tenant tables: ENABLE + FORCE, so even the owner obeys a policy. The owner's own policy is the
-- administrative path (migrations, CLI); web and workers never connect as the owner. The other
-- tables hold no tenant data (users, api_tokens, worker_processes, kind_settings, operator_audit,
-- metric_*); their grants below are the whole of their protection.

-- organizations: the scoped organization, plus the user's own organizations (for /me and the
-- membership check, which run before a tenant is chosen).
ALTER TABLE organizations ENABLE ROW LEVEL SECURITY;
ALTER TABLE organizations FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON organizations TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY tenant_read ON organizations FOR SELECT TO space_app, space_worker
    USING (id = app_org()
           OR id IN (SELECT m.organization_id FROM memberships m WHERE m.user_id = app_user()));
CREATE POLICY operator_read ON organizations FOR SELECT TO space_operator USING (true);

-- memberships: the scoped organization's, plus the user's own rows across organizations.
ALTER TABLE memberships ENABLE ROW LEVEL SECURITY;
ALTER TABLE memberships FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON memberships TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY tenant_read ON memberships FOR SELECT TO space_app, space_worker
    USING (organization_id = app_org() OR user_id = app_user());

-- projects: strictly the scoped organization.
ALTER TABLE projects ENABLE ROW LEVEL SECURITY;
ALTER TABLE projects FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON projects TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY tenant_rw ON projects TO space_app, space_worker
    USING (organization_id = app_org()) WITH CHECK (organization_id = app_org());

-- jobs, web: strictly the scoped organization (submit, list, read, cancel).
-- jobs, worker: the shared queue across organizations. SELECT ... FOR UPDATE (lock_lease) is
-- governed by UPDATE policies; a SELECT policy alone locks nothing. Nobody deletes: retention is
-- purge_finished_jobs(), as the owner.
ALTER TABLE jobs ENABLE ROW LEVEL SECURITY;
ALTER TABLE jobs FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON jobs TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY tenant_rw ON jobs TO space_app
    USING (organization_id = app_org()) WITH CHECK (organization_id = app_org());
CREATE POLICY worker_queue_read ON jobs FOR SELECT TO space_worker USING (true);
CREATE POLICY worker_queue_update ON jobs FOR UPDATE TO space_worker USING (true) WITH CHECK (true);
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

-- job_diagnostics: workers write, operators read, tenants never.
ALTER TABLE job_diagnostics ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_diagnostics FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_diagnostics TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY worker_write ON job_diagnostics FOR INSERT TO space_worker WITH CHECK (true);
CREATE POLICY operator_read ON job_diagnostics FOR SELECT TO space_operator USING (true);

-- org_audit: the web appends to the scoped organization's log (a cancel, a download; the rest
-- is written by the submit functions and the triggers, as the owner), and reads it only for an
-- owner or admin of that organization: the API checks the role too, this holds if it forgot.
ALTER TABLE org_audit ENABLE ROW LEVEL SECURITY;
ALTER TABLE org_audit FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON org_audit TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY tenant_append ON org_audit FOR INSERT TO space_app
    WITH CHECK (organization_id = app_org());
CREATE POLICY tenant_read ON org_audit FOR SELECT TO space_app
    USING (organization_id = app_org() AND EXISTS (
        SELECT 1 FROM memberships m
        WHERE m.organization_id = app_org() AND m.user_id = app_user()
          AND m.role IN ('owner', 'admin')));

-- job_quotas: the owner's alone (the CLI writes, the submit functions read as the owner).
ALTER TABLE job_quotas ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_quotas FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_quotas TO space_owner USING (true) WITH CHECK (true);

-- active_job_counts: the owner's alone (the jobs triggers write, admit_jobs() reads, as the owner).
ALTER TABLE active_job_counts ENABLE ROW LEVEL SECURITY;
ALTER TABLE active_job_counts FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON active_job_counts TO space_owner USING (true) WITH CHECK (true);

-- =============================================================================================
-- Grants, per role. USAGE on the schema comes from models/db/migrate.sql.
-- =============================================================================================

-- space_app: the web. Tenant data through the policies above; kind controls and the audit log
-- are the operators' actions, which the web performs after @operator_only.
GRANT SELECT ON organizations, users, memberships TO space_app;
GRANT SELECT, INSERT ON projects TO space_app;
-- Jobs: read (never the lease token), ask to cancel; written only through submit_job(s)().
GRANT SELECT (id, organization_id, requested_by, kind, status, params, lease_until, leased_by,
              lease_seconds, attempts, max_attempts, run_after, progress, result, result_ref,
              error_code, error_message, dedup_key, idempotency_key, request_id, last_wakeup_at,
              cancel_requested_by, created_at, updated_at, started_at, finished_at,
              cancel_requested_at, result_expired_at, retry_of)
    ON jobs TO space_app;
GRANT UPDATE (status, cancel_requested_at, cancel_requested_by) ON jobs TO space_app;
GRANT SELECT ON job_events TO space_app;
GRANT SELECT, INSERT, UPDATE ON kind_settings TO space_app;
GRANT INSERT ON operator_audit TO space_app;
-- The organizations' audit log: append and read, never change or delete (append-only).
GRANT SELECT, INSERT ON org_audit TO space_app;

-- space_worker: the queue, tenant data of the leased job's organization, its own presence row.
GRANT SELECT ON organizations, memberships TO space_worker;
GRANT SELECT, INSERT ON projects TO space_worker;
-- Jobs: the queue's metadata across organizations, never a params or a result (params come
-- from claim_jobs() for the jobs it leases); it moves the jobs it holds, deletes nothing. It
-- writes result and result_ref at its fenced finish, and reads neither.
GRANT SELECT (id, organization_id, requested_by, kind, status, lease_token, lease_until,
              leased_by, lease_seconds, attempts, max_attempts, run_after, progress,
              error_code, error_message, dedup_key, request_id, last_wakeup_at,
              cancel_requested_by, created_at, updated_at, started_at, finished_at,
              cancel_requested_at, result_expired_at, retry_of)
    ON jobs TO space_worker;
GRANT UPDATE (status, lease_token, lease_until, leased_by, attempts, run_after, progress, result,
              result_ref, error_code, error_message, last_wakeup_at)
    ON jobs TO space_worker;
GRANT SELECT ON job_events TO space_worker;
GRANT INSERT ON job_diagnostics TO space_worker;
GRANT SELECT, INSERT, UPDATE ON worker_processes TO space_worker;
GRANT SELECT ON kind_settings TO space_worker;

-- space_operator: job metadata across organizations, never params, result or the lease token
-- (hence the column lists).
GRANT SELECT ON organizations, job_events, job_diagnostics TO space_operator;
GRANT SELECT (id, email, name, is_operator, created_at) ON users TO space_operator;
GRANT SELECT (id, organization_id, requested_by, kind, status, leased_by, lease_until,
              lease_seconds, attempts, max_attempts, run_after, progress, result_ref, error_code,
              error_message, dedup_key, request_id, last_wakeup_at, cancel_requested_by,
              created_at, updated_at, started_at, finished_at, cancel_requested_at,
              result_expired_at, retry_of)
    ON jobs TO space_operator;
GRANT SELECT ON worker_processes, kind_settings, operator_audit, metric_counters, metric_events
    TO space_operator;

-- Functions: PostgreSQL lets PUBLIC execute a new function; the SECURITY DEFINER ones and the
-- raw counter bump are each opened to exactly the roles that need them.
REVOKE ALL ON FUNCTION bump_metric(text, text, text, double precision) FROM PUBLIC;
REVOKE ALL ON FUNCTION count_event(text, text, double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION count_event(text, text, double precision) TO space_app, space_worker;
REVOKE ALL ON FUNCTION fold_metric_events(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fold_metric_events(integer) TO space_worker;
REVOKE ALL ON FUNCTION purge_finished_jobs(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION purge_finished_jobs(integer) TO space_worker;
REVOKE ALL ON FUNCTION result_files_in_use(text[], uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION result_files_in_use(text[], uuid[]) TO space_worker;
REVOKE ALL ON FUNCTION results_without_files(text[], timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION results_without_files(text[], timestamptz) TO space_worker;
REVOKE ALL ON FUNCTION lease_standing(uuid[], uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lease_standing(uuid[], uuid[]) TO space_worker;
REVOKE ALL ON FUNCTION active_jobs(uuid, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION add_active_jobs(uuid[], text[], integer[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION recount_active_jobs() FROM PUBLIC;
REVOKE ALL ON FUNCTION quota_refusal(uuid, text[], integer[], integer, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION admit_jobs(uuid, text[], integer[], integer, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION submit_job(uuid, uuid, text, jsonb, integer, integer, text[], text, text,
                                  text, text, timestamptz, uuid, integer, integer, integer)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION submit_job(uuid, uuid, text, jsonb, integer, integer, text[], text, text,
                                     text, text, timestamptz, uuid, integer, integer, integer)
    TO space_app, space_worker;
REVOKE ALL ON FUNCTION submit_jobs(uuid, uuid, text[], text, text, uuid[], text[], jsonb[],
                                   integer[], integer[], text[], timestamptz[], integer, integer[],
                                   integer[])
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION submit_jobs(uuid, uuid, text[], text, text, uuid[], text[], jsonb[],
                                      integer[], integer[], text[], timestamptz[], integer,
                                      integer[], integer[])
    TO space_app, space_worker;
REVOKE ALL ON FUNCTION jobs_after_insert() FROM PUBLIC;
REVOKE ALL ON FUNCTION jobs_after_update() FROM PUBLIC;
REVOKE ALL ON FUNCTION jobs_after_delete() FROM PUBLIC;
REVOKE ALL ON FUNCTION jobs_after_truncate() FROM PUBLIC;
REVOKE ALL ON FUNCTION claim_jobs(text, integer, text[], text, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION claim_jobs(text, integer, text[], text, uuid) TO space_worker;
REVOKE ALL ON FUNCTION memberships_audit() FROM PUBLIC;
REVOKE ALL ON FUNCTION organizations_audit() FROM PUBLIC;
REVOKE ALL ON FUNCTION purge_org_audit(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION purge_org_audit(integer) TO space_worker;
REVOKE ALL ON FUNCTION login_challenge(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_login(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION login_challenge(text), check_login(text, text) TO space_app;

-- space_app, web sessions: The web starts, touches, ends and cleans up sessions; it may change nothing else of a row.
GRANT SELECT, INSERT, DELETE ON web_sessions TO space_app;
GRANT UPDATE (last_seen_at, revoked_at) ON web_sessions TO space_app;
REVOKE ALL ON FUNCTION api_principal(bytea, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION api_principal(bytea, uuid) TO space_app;
REVOKE ALL ON FUNCTION spawn_children(uuid, uuid, text, integer[], jsonb[], integer, integer)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION spawn_children(uuid, uuid, text, integer[], jsonb[], integer, integer)
    TO space_worker;
REVOKE ALL ON FUNCTION children_of(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION children_of(uuid, uuid) TO space_worker;
REVOKE ALL ON FUNCTION cancel_children(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cancel_children(uuid, uuid) TO space_worker;

-- The web and the operators see who belongs to whom.
GRANT SELECT (parent_id, child_index) ON jobs TO space_app, space_worker, space_operator;
