-- The organizations' audit log, revision 0019: who started, cancelled or downloaded which job,
-- membership and role changes, organization state changes. Each entry is written in the
-- transaction of its action: by submit_job()/submit_jobs() (replaced below, one INSERT more
-- inside the same statement), by the web's cancel and download statements, and by triggers on
-- memberships and organizations. Append-only for the application roles; retention through
-- purge_org_audit(), as the owner.

-- Who is acting, in the words job_events.actor uses ('user:<id>', 'operator:<id>', 'cli', …);
-- NULL when our code did not say.
CREATE FUNCTION app_actor() RETURNS text LANGUAGE sql STABLE AS
$$ SELECT nullif(current_setting('app.actor', true), '') $$;

-- What people did in an organization, for its owners and admins: who started, cancelled or
-- downloaded which job, who joined or left it or changed role, how its state changed. Written
-- in the transaction of the action itself (a rolled-back action leaves no entry); append-only
-- for the application roles (INSERT, never UPDATE or DELETE); retention is purge_org_audit(),
-- as the owner. Never a job's params or result: detail holds names (a kind, a role, a state)
-- and ids, under the few keys the CHECK allows.
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

-- The submit functions as before, each also writing its job's 'job.submit' entry.
CREATE OR REPLACE FUNCTION submit_job(
    p_organization_id uuid, p_requested_by uuid, p_kind text, p_params jsonb,
    p_max_attempts integer, p_lease_seconds integer, p_org_states text[], p_role text,
    p_dedup_key text, p_idempotency_key text, p_request_id text, p_run_after timestamptz,
    p_retry_of uuid)
RETURNS TABLE (
    outcome text, member_role text, member_organization_state text,
    id uuid, organization_id uuid, requested_by uuid, kind text, status text, attempts integer,
    max_attempts integer, progress jsonb, error_code text, error_message text, dedup_key text,
    run_after timestamptz, created_at timestamptz, updated_at timestamptz,
    started_at timestamptz, finished_at timestamptz, cancel_requested_at timestamptz,
    leased_by text, lease_until timestamptz, result_expired_at timestamptz, params jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    standing record;
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
            NULL::jsonb;
        RETURN;
    END IF;

    INSERT INTO jobs (organization_id, requested_by, kind, params, max_attempts, lease_seconds,
                      dedup_key, idempotency_key, request_id, run_after, retry_of)
    VALUES (p_organization_id, p_requested_by, p_kind, p_params,
            least(greatest(p_max_attempts, 1), 100), least(greatest(p_lease_seconds, 1), 86400),
            p_dedup_key, p_idempotency_key, p_request_id, coalesce(p_run_after, now()),
            -- an operator's retry-as-new-job points back at the job it retries, in its org
            (SELECT r.id FROM jobs r WHERE r.id = p_retry_of
                                        AND r.organization_id = p_organization_id))
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
            made.dedup_key, made.run_after, made.created_at, made.updated_at, made.started_at,
            made.finished_at, made.cancel_requested_at, made.leased_by, made.lease_until,
            made.result_expired_at, made.params;
        RETURN;
    END IF;

    IF p_idempotency_key IS NOT NULL THEN
        SELECT * INTO made FROM jobs j
        WHERE j.organization_id = p_organization_id AND j.requested_by = p_requested_by
          AND j.idempotency_key = p_idempotency_key;
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
        made.result_expired_at, made.params;
END $$;

CREATE OR REPLACE FUNCTION submit_jobs(
    p_organization_id uuid, p_requested_by uuid, p_org_states text[], p_role text,
    p_request_id text, p_ids uuid[], p_kinds text[], p_params jsonb[], p_max_attempts integer[],
    p_lease_seconds integer[], p_dedup_keys text[], p_run_afters timestamptz[])
RETURNS TABLE (
    outcome text, member_role text, member_organization_state text,
    id uuid, organization_id uuid, requested_by uuid, kind text, status text, attempts integer,
    max_attempts integer, progress jsonb, error_code text, error_message text, dedup_key text,
    run_after timestamptz, created_at timestamptz, updated_at timestamptz,
    started_at timestamptz, finished_at timestamptz, cancel_requested_at timestamptz,
    leased_by text, lease_until timestamptz, result_expired_at timestamptz, params jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    standing record;
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
            NULL::jsonb;
        RETURN;
    END IF;
    RETURN QUERY
    WITH made AS (
        INSERT INTO jobs AS j (id, organization_id, requested_by, kind, params, max_attempts,
                               lease_seconds, dedup_key, request_id, run_after)
        SELECT n.id, p_organization_id, p_requested_by, n.kind, n.params,
               least(greatest(n.max_attempts, 1), 100), least(greatest(n.lease_seconds, 1), 86400),
               n.dedup_key, p_request_id, coalesce(n.run_after, now())
        FROM unnest(p_ids, p_kinds, p_params, p_max_attempts, p_lease_seconds, p_dedup_keys,
                    p_run_afters) AS n (id, kind, params, max_attempts, lease_seconds,
                                        dedup_key, run_after)
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
        made.params
    FROM made;
END $$;

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

-- Retention of the audit log, by age, in bounded batches, by the sweeper. As the owner: no
-- application role may delete an entry.
CREATE FUNCTION purge_org_audit(age interval, batch integer) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    WITH old AS (
        SELECT id FROM org_audit WHERE at < now() - age LIMIT batch FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM org_audit a USING old WHERE a.id = old.id RETURNING 1
    )
    SELECT count(*)::integer FROM gone
$$;

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

GRANT SELECT, INSERT ON org_audit TO space_app;
REVOKE ALL ON FUNCTION memberships_audit() FROM PUBLIC;
REVOKE ALL ON FUNCTION organizations_audit() FROM PUBLIC;
REVOKE ALL ON FUNCTION purge_org_audit(interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION purge_org_audit(interval, integer) TO space_worker;
