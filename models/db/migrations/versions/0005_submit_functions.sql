-- Submits as functions, revision 0005. A submit is one statement: the requester's standing
-- (held FOR SHARE until commit, as a worker's finish holds it), the insert and its events, and
-- the answer for a replayed Idempotency-Key or an active duplicate. One round trip instead of
-- four, and a job is only ever born the way these functions make it: queued, attempt 0, no
-- lease, no result, bounded attempts and lease.
--
-- SECURITY DEFINER: they write as the owner whatever the caller's scope, so they check the
-- membership themselves. The rules they apply come from the caller's code (the kind's allowed
-- organization states and least role), as the requester comes from the authenticated context.

CREATE FUNCTION role_rank(role text) RETURNS integer LANGUAGE sql IMMUTABLE AS $$
    SELECT array_position(ARRAY['member', 'admin', 'owner'], role)
$$;

-- outcome: 'created', 'replayed' (an Idempotency-Key seen before: the first job is answered),
-- 'duplicate' (an active job has the dedup_key: its id is answered), or 'refused' (the
-- requester's role and the organization's state are answered, NULL for a non-member, so the
-- caller can say why in its own words).
CREATE FUNCTION submit_job(
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

-- The bulk submit: many jobs of the organization in one statement, ids made by the caller so
-- the answer keeps the request's order. The standing is checked once against the strictest
-- rules of the batch's kinds (every state they all allow, the highest role any needs): the
-- caller tells which item a refusal concerns. A row that meets an active duplicate is skipped
-- and missing from the answer; the caller then rolls the batch back: all or nothing.
CREATE FUNCTION submit_jobs(
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
    )
    SELECT 'created', standing.role, standing.state, made.id, made.organization_id,
        made.requested_by, made.kind, made.status, made.attempts, made.max_attempts,
        made.progress, made.error_code, made.error_message, made.dedup_key, made.run_after,
        made.created_at, made.updated_at, made.started_at, made.finished_at,
        made.cancel_requested_at, made.leased_by, made.lease_until, made.result_expired_at,
        made.params
    FROM made;
END $$;

REVOKE ALL ON FUNCTION submit_job(uuid, uuid, text, jsonb, integer, integer, text[], text, text,
                                  text, text, timestamptz, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION submit_job(uuid, uuid, text, jsonb, integer, integer, text[], text, text,
                                     text, text, timestamptz, uuid) TO space_app, space_worker;
REVOKE ALL ON FUNCTION submit_jobs(uuid, uuid, text[], text, text, uuid[], text[], jsonb[],
                                   integer[], integer[], text[], timestamptz[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION submit_jobs(uuid, uuid, text[], text, text, uuid[], text[], jsonb[],
                                      integer[], integer[], text[], timestamptz[])
    TO space_app, space_worker;
