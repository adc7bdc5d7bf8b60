-- Space Jobs schema, revision 0001. Runs as the owner role (space_owner), never as a superuser,
-- so FORCE ROW LEVEL SECURITY applies to the owner too.

-- The tenant of the current transaction and the authenticated user, set by our own code with
-- set_config(..., true). After such a transaction ends the same pooled connection reads '' (not
-- NULL), hence nullif. A missing setting means "no tenant": every tenant policy then matches nothing.
CREATE FUNCTION app_org() RETURNS uuid LANGUAGE sql STABLE AS
$$ SELECT nullif(current_setting('app.organization_id', true), '')::uuid $$;

CREATE FUNCTION app_user() RETURNS uuid LANGUAGE sql STABLE AS
$$ SELECT nullif(current_setting('app.user_id', true), '')::uuid $$;

CREATE TABLE organizations (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    state       text NOT NULL DEFAULT 'active'
                CHECK (state IN ('active', 'read_only', 'deleting', 'deleted')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
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
CREATE INDEX projects_created_by_job_idx ON projects (created_by_job) WHERE created_by_job IS NOT NULL;
CREATE INDEX projects_org_idx ON projects (organization_id, created_at, id);

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
    -- A lease exists exactly while someone may be running the job.
    CHECK ((status IN ('leased', 'cancel_requested')) =
           (lease_token IS NOT NULL AND lease_until IS NOT NULL))
);

-- The claim reads only these partial indexes, so its cost follows the number of ACTIVE jobs,
-- not the millions of finished rows behind them.
CREATE INDEX jobs_claimable_idx ON jobs (run_after, created_at) WHERE status = 'queued';
CREATE INDEX jobs_lease_expiry_idx ON jobs (lease_until) WHERE status IN ('leased', 'cancel_requested');
-- Tenant listing, newest first, with keyset pagination.
CREATE INDEX jobs_org_created_idx ON jobs (organization_id, created_at DESC, id DESC);
-- Retention walks finished rows by age.
CREATE INDEX jobs_finished_idx ON jobs (finished_at) WHERE finished_at IS NOT NULL;
-- At most one ACTIVE job per (organization, kind, dedup_key), across every web instance.
CREATE UNIQUE INDEX jobs_dedup_active_idx ON jobs (organization_id, kind, dedup_key)
    WHERE dedup_key IS NOT NULL AND status IN ('queued', 'leased', 'cancel_requested');
-- Replays of a submit with the same Idempotency-Key by the same user find the first job.
CREATE UNIQUE INDEX jobs_idempotency_idx ON jobs (organization_id, requested_by, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE TABLE job_events (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id           uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    organization_id  uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    from_status      text,
    to_status        text NOT NULL,
    attempt          integer NOT NULL,
    actor            text NOT NULL,
    at               timestamptz NOT NULL DEFAULT clock_timestamp()
);
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
CREATE INDEX job_diagnostics_job_idx ON job_diagnostics (job_id, id);

-- ---------------------------------------------------------------------------------------------
-- Transitions are enforced here, whatever client writes the row.
-- ---------------------------------------------------------------------------------------------
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

-- Every status change (and a re-lease after expiry, which is a new attempt) leaves an event
-- in the same transaction. The actor is set by our code per transaction ('user:<id>',
-- 'worker:<host>:<pid>', 'sweeper', ...).
CREATE FUNCTION jobs_record_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.status <> OLD.status OR NEW.attempts <> OLD.attempts THEN
        INSERT INTO job_events (job_id, organization_id, from_status, to_status, attempt, actor)
        VALUES (NEW.id, NEW.organization_id,
                CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END, NEW.status, NEW.attempts,
                coalesce(nullif(current_setting('app.actor', true), ''), current_user));
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_record_event AFTER INSERT OR UPDATE ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_record_event();

-- Row-level security and grants. The roles themselves are created by `spacejobs db upgrade`
-- (models/db/migrate.sql: cluster-wide objects an owner role may not create).
--
-- Tenant tables: ENABLE + FORCE, so even the owner obeys a policy. The owner's own policy is the
-- administrative path (migrations, CLI); web and workers never connect as the owner.

ALTER TABLE organizations ENABLE ROW LEVEL SECURITY;
ALTER TABLE organizations FORCE ROW LEVEL SECURITY;
ALTER TABLE memberships ENABLE ROW LEVEL SECURITY;
ALTER TABLE memberships FORCE ROW LEVEL SECURITY;
ALTER TABLE projects ENABLE ROW LEVEL SECURITY;
ALTER TABLE projects FORCE ROW LEVEL SECURITY;
ALTER TABLE jobs ENABLE ROW LEVEL SECURITY;
ALTER TABLE jobs FORCE ROW LEVEL SECURITY;
ALTER TABLE job_events ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_events FORCE ROW LEVEL SECURITY;
ALTER TABLE job_diagnostics ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_diagnostics FORCE ROW LEVEL SECURITY;

CREATE POLICY owner_admin ON organizations TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY owner_admin ON memberships TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY owner_admin ON projects TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY owner_admin ON jobs TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY owner_admin ON job_events TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY owner_admin ON job_diagnostics TO space_owner USING (true) WITH CHECK (true);

-- organizations: the scoped organization, plus the user's own organizations (for /me and the
-- membership check, which run before a tenant is chosen).
CREATE POLICY tenant_read ON organizations FOR SELECT TO space_app, space_worker
    USING (id = app_org()
           OR id IN (SELECT m.organization_id FROM memberships m WHERE m.user_id = app_user()));
CREATE POLICY operator_read ON organizations FOR SELECT TO space_operator USING (true);

-- memberships: the scoped organization's, plus the user's own rows across organizations.
CREATE POLICY tenant_read ON memberships FOR SELECT TO space_app, space_worker
    USING (organization_id = app_org() OR user_id = app_user());

-- projects: strictly the scoped organization.
CREATE POLICY tenant_rw ON projects TO space_app, space_worker
    USING (organization_id = app_org()) WITH CHECK (organization_id = app_org());

-- jobs, web: strictly the scoped organization (submit, list, read, cancel).
CREATE POLICY tenant_rw ON jobs TO space_app
    USING (organization_id = app_org()) WITH CHECK (organization_id = app_org());
-- jobs, worker: the shared queue across organizations. SELECT ... FOR UPDATE SKIP LOCKED is
-- governed by UPDATE policies, so the claim needs this one; a SELECT policy alone claims nothing.
CREATE POLICY worker_queue_read ON jobs FOR SELECT TO space_worker USING (true);
CREATE POLICY worker_queue_update ON jobs FOR UPDATE TO space_worker USING (true) WITH CHECK (true);
CREATE POLICY worker_retention ON jobs FOR DELETE TO space_worker
    USING (status IN ('completed', 'failed', 'cancelled'));
CREATE POLICY operator_read ON jobs FOR SELECT TO space_operator USING (true);

-- job_events: written by the transition trigger as whoever made the transition.
CREATE POLICY tenant_rw ON job_events TO space_app
    USING (organization_id = app_org()) WITH CHECK (organization_id = app_org());
CREATE POLICY worker_write ON job_events FOR INSERT TO space_worker WITH CHECK (true);
CREATE POLICY worker_read ON job_events FOR SELECT TO space_worker
    USING (organization_id = app_org());
CREATE POLICY worker_retention ON job_events FOR DELETE TO space_worker USING (true);
CREATE POLICY operator_read ON job_events FOR SELECT TO space_operator USING (true);

-- job_diagnostics: workers write, operators read, tenants never.
CREATE POLICY worker_write ON job_diagnostics FOR INSERT TO space_worker WITH CHECK (true);
CREATE POLICY worker_retention ON job_diagnostics FOR DELETE TO space_worker USING (true);
CREATE POLICY operator_read ON job_diagnostics FOR SELECT TO space_operator USING (true);

GRANT SELECT ON organizations, users, api_tokens, memberships TO space_app;
GRANT SELECT, INSERT ON projects TO space_app;
GRANT SELECT, INSERT, UPDATE ON jobs TO space_app;
GRANT SELECT, INSERT ON job_events TO space_app;

GRANT SELECT ON organizations, memberships TO space_worker;
GRANT SELECT, INSERT ON projects TO space_worker;
GRANT SELECT, UPDATE, DELETE ON jobs TO space_worker;
GRANT SELECT, INSERT, DELETE ON job_events TO space_worker;
GRANT INSERT, DELETE ON job_diagnostics TO space_worker;

-- The operator sees job metadata across organizations, never params, result or the lease token.
GRANT SELECT ON organizations, job_events, job_diagnostics TO space_operator;
GRANT SELECT (id, email, name, is_operator, created_at) ON users TO space_operator;
GRANT SELECT (id, organization_id, requested_by, kind, status, leased_by, lease_until,
              lease_seconds, attempts, max_attempts, run_after, progress, result_ref, error_code,
              error_message, dedup_key, request_id, last_wakeup_at, cancel_requested_by,
              created_at, updated_at, started_at, finished_at, cancel_requested_at,
              result_expired_at)
    ON jobs TO space_operator;
