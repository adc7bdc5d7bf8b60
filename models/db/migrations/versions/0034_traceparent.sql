-- Revision 0034: the trace context of whatever submitted a job, on its row.
--
-- jobs.traceparent (W3C, version 00), written by the submit functions from a new optional
-- argument and inherited by children from their parent; read only by the worker role, which
-- parents its attempts' spans with it.

ALTER TABLE jobs ADD COLUMN traceparent text CONSTRAINT jobs_traceparent_w3c
    CHECK (traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');

GRANT SELECT (traceparent) ON jobs TO space_worker;

-- The submits take the trace context as one more optional argument, the last, so the previous
-- release's callers (by name, without it) still reach them: a new signature, so DROP + CREATE.
DROP FUNCTION submit_job(uuid, uuid, text, jsonb, integer, integer, text[], text, text, text, text,
                         timestamptz, uuid, integer, integer, integer);

CREATE FUNCTION submit_job(
    p_organization_id uuid, p_requested_by uuid, p_kind text, p_params jsonb,
    p_max_attempts integer, p_lease_seconds integer, p_org_states text[], p_role text,
    p_dedup_key text DEFAULT NULL, p_idempotency_key text DEFAULT NULL,
    p_request_id text DEFAULT NULL, p_run_after timestamptz DEFAULT NULL,
    p_retry_of uuid DEFAULT NULL, p_org_quota integer DEFAULT NULL,
    p_kind_quota integer DEFAULT NULL, p_priority integer DEFAULT NULL,
    p_traceparent text DEFAULT NULL)
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
                          retry_of, priority, traceparent)
        VALUES (p_organization_id, p_requested_by, p_kind, p_params,
                least(greatest(p_max_attempts, 1), 100), least(greatest(p_lease_seconds, 1), 86400),
                p_dedup_key, p_idempotency_key, p_request_id, coalesce(p_run_after, now()),
                -- an operator's retry-as-new-job points back at the job it retries, in its org
                (SELECT r.id FROM jobs r WHERE r.id = p_retry_of
                                            AND r.organization_id = p_organization_id),
                -- out of range is the column CHECK's refusal, never a silent clamp
                coalesce(p_priority, 0), p_traceparent)
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
REVOKE ALL ON FUNCTION submit_job(uuid, uuid, text, jsonb, integer, integer, text[], text, text,
                                  text, text, timestamptz, uuid, integer, integer, integer, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION submit_job(uuid, uuid, text, jsonb, integer, integer, text[], text, text,
                                     text, text, timestamptz, uuid, integer, integer, integer, text)
    TO space_app, space_worker;

DROP FUNCTION submit_jobs(uuid, uuid, text[], text, text, uuid[], text[], jsonb[], integer[],
                          integer[], text[], timestamptz[], integer, integer[], integer[]);

CREATE FUNCTION submit_jobs(
    p_organization_id uuid, p_requested_by uuid, p_org_states text[], p_role text,
    p_request_id text, p_ids uuid[], p_kinds text[], p_params jsonb[], p_max_attempts integer[],
    p_lease_seconds integer[], p_dedup_keys text[], p_run_afters timestamptz[],
    p_org_quota integer, p_kind_quotas integer[], p_priorities integer[],
    p_traceparent text DEFAULT NULL)
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
                               lease_seconds, dedup_key, request_id, run_after, priority,
                               traceparent)
        SELECT n.id, p_organization_id, p_requested_by, n.kind, n.params,
               least(greatest(n.max_attempts, 1), 100), least(greatest(n.lease_seconds, 1), 86400),
               n.dedup_key, p_request_id, coalesce(n.run_after, now()), coalesce(n.priority, 0),
               p_traceparent
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
REVOKE ALL ON FUNCTION submit_jobs(uuid, uuid, text[], text, text, uuid[], text[], jsonb[],
                                   integer[], integer[], text[], timestamptz[], integer, integer[],
                                   integer[], text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION submit_jobs(uuid, uuid, text[], text, text, uuid[], text[], jsonb[],
                                      integer[], integer[], text[], timestamptz[], integer,
                                      integer[], integer[], text)
    TO space_app, space_worker;

-- A child (a fan-out's item, a workflow's step) is part of its parent's trace: it takes the
-- parent's trace context when it is made (revision 0034), one probe of jobs_pkey per child,
-- and none at all for the jobs that have no parent (the trigger's WHEN). Its attempts' spans
-- are then children of the span that submitted the parent, beside the parent's own.
CREATE FUNCTION jobs_inherit_traceparent() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    NEW.traceparent := (SELECT p.traceparent FROM jobs p WHERE p.id = NEW.parent_id);
    RETURN NEW;
END $$;
REVOKE ALL ON FUNCTION jobs_inherit_traceparent() FROM PUBLIC;

CREATE TRIGGER jobs_inherit_traceparent BEFORE INSERT ON jobs
    FOR EACH ROW WHEN (NEW.parent_id IS NOT NULL AND NEW.traceparent IS NULL)
    EXECUTE FUNCTION jobs_inherit_traceparent();
