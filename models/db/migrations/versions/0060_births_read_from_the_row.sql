-- Revision 0060: a job's birth is read from its row, not written as a job_events row (issue 32,
-- a job's WAL).
--
-- Every submit wrote a job_events row and its key's entry for facts its row holds: who asked
-- (requested_by, and now submitted_as when someone else submits: an operator's retry, a
-- worker's children, the CLI) and when (created_at). bench.cost: 3,247 -> 3,015 bytes of WAL a
-- job's whole life without them. job_history gives a job's whole history, its birth first;
-- the dashboard and every reader of a history read it. The jobs' insert trigger writes a
-- stored event only for a row the owner plants in another state, from 'queued'. The four
-- statements that insert jobs set submitted_as, and the two that make children stamp their
-- created_at with clock_timestamp(), the moment their birth event used to carry; CREATE OR
-- REPLACE keeps their grants and the trigger.
-- Existing jobs: a birth by someone other than the requester moves to submitted_as (the jobs'
-- triggers off: terminal rows are otherwise frozen, and the change is no transition), a
-- planted birth becomes an event from 'queued', and the stored queued births are deleted.

ALTER TABLE jobs ADD COLUMN submitted_as text;

ALTER TABLE jobs DISABLE TRIGGER USER;
UPDATE jobs j SET submitted_as = e.actor
FROM job_events e
WHERE e.job_id = j.id AND e.from_status IS NULL AND e.actor <> 'user:' || j.requested_by;
ALTER TABLE jobs ENABLE TRIGGER USER;
UPDATE job_events SET from_status = 'queued' WHERE from_status IS NULL AND to_status <> 'queued';
DELETE FROM job_events WHERE from_status IS NULL;

CREATE VIEW job_history WITH (security_invoker = true) AS
SELECT 0::bigint AS id, j.id AS job_id, j.organization_id, NULL::text AS from_status,
       'queued'::text AS to_status, 0 AS attempt,
       coalesce(j.submitted_as, 'user:' || j.requested_by) AS actor, j.created_at AS at
FROM jobs j
WHERE current_user <> 'space_worker' OR j.organization_id = app_org()
UNION ALL
SELECT e.id, e.job_id, e.organization_id, e.from_status, e.to_status, e.attempt, e.actor, e.at
FROM job_events e;

GRANT SELECT ON job_history TO space_app, space_worker, space_operator;
GRANT SELECT (submitted_as) ON jobs TO space_app, space_worker, space_operator;

CREATE OR REPLACE FUNCTION jobs_after_insert() RETURNS trigger
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
    SELECT n.id, n.organization_id, 'queued', n.status, n.attempts,
           coalesce(app_actor(), 'user:' || n.requested_by)
    FROM new_jobs n WHERE n.status <> 'queued';
    IF EXISTS (SELECT FROM new_jobs) THEN
        PERFORM pg_notify('spacejobs_jobs', '');
    END IF;
    PERFORM add_active_jobs(array_agg(n.organization_id), array_agg(n.kind), array_agg(1))
    FROM new_jobs n WHERE n.status IN ('queued', 'leased', 'cancel_requested', 'waiting');
    -- Jobs born queued: no head of their keys is further on than they are.
    PERFORM lower_claim_heads(array_agg(n.organization_id), array_agg(n.priority),
                              array_agg(n.run_after), array_agg(n.created_at))
    FROM new_jobs n WHERE n.status = 'queued' HAVING count(*) > 0;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION submit_jobs(
    p_organization_id uuid, p_requested_by uuid, p_org_states text[], p_role text,
    p_request_id text, p_ids uuid[], p_kinds text[], p_params jsonb[], p_max_attempts integer[],
    p_lease_seconds integer[], p_dedup_keys text[], p_run_afters timestamptz[],
    p_org_quota integer, p_kind_quotas integer[], p_priorities integer[],
    p_traceparent text DEFAULT NULL, p_sequence_keys text[] DEFAULT NULL,
    p_quota_kinds text[] DEFAULT NULL, p_quota_caps integer[] DEFAULT NULL,
    p_debounce_seconds integer[] DEFAULT NULL, p_idempotency_key text DEFAULT NULL,
    p_retry_of uuid DEFAULT NULL, p_bulk boolean DEFAULT true)
RETURNS TABLE (
    outcome text, member_role text, member_organization_state text,
    id uuid, organization_id uuid, requested_by uuid, kind text, status text, attempts integer,
    max_attempts integer, progress jsonb, error_code text, error_message text, dedup_key text,
    run_after timestamptz, created_at timestamptz, updated_at timestamptz,
    started_at timestamptz, finished_at timestamptz, cancel_requested_at timestamptz,
    leased_by text, lease_until timestamptz, result_expired_at timestamptz, params jsonb,
    quota_kind text, quota_limit integer, sequence_key text, request_place integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    -- before the FOR SHARE below, which takes a transaction id without writing a job
    first_write CONSTANT boolean := pg_current_xact_id_if_assigned() IS NULL;
    wanted CONSTANT integer := cardinality(p_ids);
    standing record;
    refusal record;
    sequence_lock integer;
    -- places answered before the insert (debounced): not written, not admitted
    answered integer[] := '{}';
    -- the steps of the batch's workflows, admitted with them and counted as active from now on
    step_kinds text[];
    kinds_left text[];
    caps_left integer[];
    created integer;
    found_job jobs;
    replaced_requester uuid;
    missing integer;
BEGIN
    IF p_idempotency_key IS NOT NULL AND wanted <> 1 THEN
        RAISE EXCEPTION 'an Idempotency-Key names one job' USING ERRCODE = 'invalid_parameter_value';
    END IF;
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
            NULL::jsonb, NULL, NULL::integer, NULL, NULL::integer;
        RETURN;
    END IF;

    -- One submit of a sequence at a time, each taking its places after the last one's commit:
    -- were two in flight, the later place could commit first, run, and then the earlier one
    -- start beside it (the claim sees only what has committed). One lock per key, in one order.
    IF p_sequence_keys IS NOT NULL THEN
        FOR sequence_lock IN
            SELECT DISTINCT hashtext('spacejobs.sequence:' || p_organization_id::text || ':'
                                     || k.key)
            FROM unnest(p_sequence_keys) AS k (key) WHERE k.key IS NOT NULL ORDER BY 1
        LOOP
            PERFORM pg_advisory_xact_lock(sequence_lock);
        END LOOP;
    END IF;

    -- A debounce: the queued, never started job with the key takes the new params and moves
    -- its start. Debounces of one key take turns (the lock, until commit), so each sees the job
    -- the one before made; a claim that leases the job first (its row lock, then a status this
    -- no longer matches) leaves nothing to update, and a new job is made. Never a workflow:
    -- its steps were admitted and reserved with it, and new params would bring other steps.
    IF p_debounce_seconds IS NOT NULL THEN
        FOR i IN 1 .. wanted LOOP
            CONTINUE WHEN p_debounce_seconds[i] IS NULL OR p_dedup_keys[i] IS NULL
                OR cardinality(workflow_step_kinds(p_kinds[i], p_params[i])) > 0;
            PERFORM pg_advisory_xact_lock(hashtext('spacejobs.debounce:'
                                                   || p_organization_id::text || ':'
                                                   || p_kinds[i] || ':' || p_dedup_keys[i]));
            found_job := NULL;
            SELECT j.id, j.requested_by INTO found_job.id, replaced_requester FROM jobs j
            WHERE j.organization_id = p_organization_id AND j.kind = p_kinds[i]
              AND j.dedup_key = p_dedup_keys[i] AND j.debounce_seconds IS NOT NULL
              AND j.status = 'queued' AND j.attempts = 0
            FOR UPDATE;
            CONTINUE WHEN found_job.id IS NULL;
            UPDATE jobs j
            SET params = p_params[i], requested_by = p_requested_by,
                run_after = now() + p_debounce_seconds[i] * interval '1 second',
                debounce_seconds = p_debounce_seconds[i], request_id = p_request_id
            WHERE j.id = found_job.id
            RETURNING * INTO found_job;
            -- Both requesters: the actor, and as the entry's member the one whose job it was,
            -- when that was someone else (their job now runs for the actor).
            INSERT INTO org_audit (organization_id, actor_id, actor, action, job_id, member_id,
                                   detail, request_id)
            VALUES (p_organization_id, coalesce(app_user(), p_requested_by),
                    coalesce(app_actor(), 'user:' || p_requested_by), 'job.debounce',
                    found_job.id, nullif(replaced_requester, p_requested_by),
                    jsonb_build_object('kind', p_kinds[i]), p_request_id);
            RETURN QUERY SELECT 'debounced', standing.role, standing.state, j.id,
                j.organization_id, j.requested_by, j.kind, j.status, j.attempts, j.max_attempts,
                j.progress, j.error_code, j.error_message, j.dedup_key, j.run_after,
                j.created_at, j.updated_at, j.started_at, j.finished_at, j.cancel_requested_at,
                j.leased_by, j.lease_until, j.result_expired_at, j.params, NULL, NULL::integer,
                j.sequence_key, i
            FROM unnest(ARRAY[found_job]) AS j;
            answered := answered || i;
        END LOOP;
        IF cardinality(answered) = wanted THEN
            RETURN;
        END IF;
    END IF;

    -- A replay answers the first job even at the cap: it asks for nothing new.
    IF p_idempotency_key IS NOT NULL THEN
        SELECT * INTO found_job FROM jobs j
        WHERE j.organization_id = p_organization_id AND j.requested_by = p_requested_by
          AND j.idempotency_key = p_idempotency_key;
        IF found_job.id IS NOT NULL THEN
            RETURN QUERY SELECT 'replayed', standing.role, standing.state, j.id,
                j.organization_id, j.requested_by, j.kind, j.status, j.attempts, j.max_attempts,
                j.progress, j.error_code, j.error_message, j.dedup_key, j.run_after,
                j.created_at, j.updated_at, j.started_at, j.finished_at, j.cancel_requested_at,
                j.leased_by, j.lease_until, j.result_expired_at, j.params, NULL, NULL::integer,
                j.sequence_key, 1
            FROM unnest(ARRAY[found_job]) AS j;
            RETURN;
        END IF;
    END IF;

    IF cardinality(answered) = 0 THEN
        kinds_left := p_kinds;
        caps_left := p_kind_quotas;
        step_kinds := ARRAY(SELECT unnest(workflow_step_kinds(u.kind, u.params))
                            FROM unnest(p_kinds, p_params) AS u (kind, params));
    ELSE
        kinds_left := ARRAY(SELECT u.kind FROM unnest(p_kinds) WITH ORDINALITY AS u (kind, place)
                            WHERE u.place <> ALL (answered) ORDER BY u.place);
        caps_left := ARRAY(SELECT u.cap FROM unnest(p_kind_quotas) WITH ORDINALITY AS u (cap, place)
                           WHERE u.place <> ALL (answered) ORDER BY u.place);
        step_kinds := ARRAY(SELECT unnest(workflow_step_kinds(u.kind, u.params))
                            FROM unnest(p_kinds, p_params) WITH ORDINALITY AS u (kind, params, place)
                            WHERE u.place <> ALL (answered) ORDER BY u.place);
    END IF;
    SELECT * INTO refusal
    FROM admit_jobs(p_organization_id, kinds_left || step_kinds, caps_left || ARRAY(
                        SELECT c.cap FROM unnest(step_kinds) WITH ORDINALITY AS k (kind, n)
                        LEFT JOIN unnest(p_quota_kinds, p_quota_caps) AS c (kind, cap)
                               ON c.kind = k.kind
                        ORDER BY k.n),
                    (SELECT q.active_jobs FROM quota_policy q), first_write);
    IF FOUND THEN
        RETURN QUERY SELECT 'over_quota', standing.role, standing.state, NULL::uuid, NULL::uuid,
            NULL::uuid, NULL, NULL, NULL::integer, NULL::integer, NULL::jsonb, NULL, NULL, NULL,
            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
            NULL::timestamptz, NULL::timestamptz, NULL, NULL::timestamptz, NULL::timestamptz,
            NULL::jsonb, refusal.refused_kind, refusal.cap, NULL, NULL::integer;
        RETURN;
    END IF;

    RETURN QUERY
    WITH written AS (
        INSERT INTO jobs AS j (id, organization_id, requested_by, kind, params, max_attempts,
                               lease_seconds, dedup_key, idempotency_key, request_id, run_after,
                               retry_of, priority, traceparent, sequence_key, sequence_position,
                               debounce_seconds, submitted_as)
        SELECT n.id, p_organization_id, p_requested_by, n.kind, n.params,
               least(greatest(n.max_attempts, 1), 100), least(greatest(n.lease_seconds, 1), 86400),
               n.dedup_key, p_idempotency_key, p_request_id,
               CASE WHEN n.debounce IS NOT NULL AND n.dedup_key IS NOT NULL
                    THEN greatest(coalesce(n.run_after, now()),
                                  now() + n.debounce * interval '1 second')
                    ELSE coalesce(n.run_after, now()) END,
               -- an operator's retry-as-new-job points back at the job it retries, in its org
               (SELECT r.id FROM jobs r WHERE r.id = p_retry_of
                                           AND r.organization_id = p_organization_id),
               -- out of range is the column CHECK's refusal, never a silent clamp
               coalesce(n.priority, 0), p_traceparent, n.sequence_key,
               -- taken row by row in the batch's order (the subquery's), so places follow it
               CASE WHEN n.sequence_key IS NOT NULL THEN nextval('job_sequence_positions') END,
               CASE WHEN n.dedup_key IS NOT NULL
                         AND cardinality(workflow_step_kinds(n.kind, n.params)) = 0
                    THEN n.debounce END,
               -- who submits, when not the requester (job_history's birth)
               nullif(app_actor(), 'user:' || p_requested_by)
        FROM (SELECT u.* FROM unnest(p_ids, p_kinds, p_params, p_max_attempts, p_lease_seconds,
                                     p_dedup_keys, p_run_afters, p_priorities,
                                     coalesce(p_sequence_keys,
                                              array_fill(NULL::text, ARRAY[wanted])),
                                     coalesce(p_debounce_seconds,
                                              array_fill(NULL::integer, ARRAY[wanted])))
                  WITH ORDINALITY AS u (id, kind, params, max_attempts, lease_seconds,
                                        dedup_key, run_after, priority, sequence_key, debounce,
                                        place)
              WHERE u.place <> ALL (answered)
              ORDER BY u.place) AS n
        ON CONFLICT DO NOTHING
        RETURNING j.*
    ), audited AS (
        -- Who started each, for the organization's audit log: the scoped user (an operator's
        -- retry scopes the operator), else the requester.
        INSERT INTO org_audit (organization_id, actor_id, actor, action, job_id, detail,
                               request_id)
        SELECT p_organization_id, coalesce(app_user(), p_requested_by),
               coalesce(app_actor(), 'user:' || p_requested_by), 'job.submit', w.id,
               CASE WHEN p_bulk THEN jsonb_build_object('kind', w.kind, 'bulk', true)
                    ELSE jsonb_strip_nulls(jsonb_build_object('kind', w.kind,
                                                              'retry_of', w.retry_of)) END,
               p_request_id
        FROM written w
    )
    SELECT 'created', standing.role, standing.state, w.id, w.organization_id,
        w.requested_by, w.kind, w.status, w.attempts, w.max_attempts, w.progress, w.error_code,
        w.error_message, w.dedup_key, w.run_after, w.created_at, w.updated_at, w.started_at,
        w.finished_at, w.cancel_requested_at, w.leased_by, w.lease_until, w.result_expired_at,
        w.params, NULL, NULL::integer, w.sequence_key, k.place::integer
    FROM written w JOIN unnest(p_ids) WITH ORDINALITY AS k (id, place) ON k.id = w.id;
    GET DIAGNOSTICS created = ROW_COUNT;
    IF cardinality(step_kinds) > 0 THEN
        -- The steps of each workflow written, counted as active from now on (reserve_children()).
        -- Only then: the statement triggers of job_reservations fire even for no row.
        INSERT INTO job_reservations AS r (parent_id, organization_id, kind, reserved)
        SELECT j.id, p_organization_id, s.kind, count(*)
        FROM jobs j, unnest(workflow_step_kinds(j.kind, j.params)) AS s (kind)
        WHERE j.id = ANY (p_ids)
        GROUP BY j.id, s.kind
        ON CONFLICT ON CONSTRAINT job_reservations_pkey
        DO UPDATE SET reserved = r.reserved + excluded.reserved;
    END IF;
    IF created + cardinality(answered) = wanted THEN
        RETURN;
    END IF;

    -- A conflict: the same Idempotency-Key committed meanwhile, or an active duplicate. Each
    -- lookup is a statement of its own, which sees what committed since the insert began.
    FOR missing IN
        SELECT k.place FROM unnest(p_ids) WITH ORDINALITY AS k (id, place)
        WHERE k.place <> ALL (answered) AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = k.id)
        ORDER BY k.place
    LOOP
        found_job := NULL;
        IF p_idempotency_key IS NOT NULL THEN
            SELECT * INTO found_job FROM jobs j
            WHERE j.organization_id = p_organization_id AND j.requested_by = p_requested_by
              AND j.idempotency_key = p_idempotency_key;
        END IF;
        IF found_job.id IS NULL THEN
            -- The conflicting job may have ended in between: then there is nothing to name,
            -- and the caller may simply submit again.
            SELECT * INTO found_job FROM jobs j
            WHERE j.organization_id = p_organization_id AND j.kind = p_kinds[missing]
              AND j.dedup_key = p_dedup_keys[missing]
              AND j.status IN ('queued', 'leased', 'cancel_requested', 'waiting')
              AND (j.debounce_seconds IS NULL) = (p_debounce_seconds[missing] IS NULL);
        END IF;
        RETURN QUERY SELECT CASE WHEN p_idempotency_key IS NOT NULL
                                      AND j.idempotency_key IS NOT DISTINCT FROM p_idempotency_key
                                 THEN 'replayed' ELSE 'duplicate' END,
            standing.role, standing.state, j.id, j.organization_id, j.requested_by, j.kind,
            j.status, j.attempts, j.max_attempts, j.progress, j.error_code, j.error_message,
            j.dedup_key, j.run_after, j.created_at, j.updated_at, j.started_at, j.finished_at,
            j.cancel_requested_at, j.leased_by, j.lease_until, j.result_expired_at, j.params,
            NULL, NULL::integer, j.sequence_key, missing
        FROM unnest(ARRAY[found_job]) AS j;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION release_children(p_parents uuid[]) RETURNS integer
LANGUAGE plpgsql SET search_path = public, pg_temp
-- Index probes by parent and place: the jobs trigger that calls it turns nested loops off for
-- its transition tables, which would make these hash joins over every job.
SET enable_nestloop = on AS $$
DECLARE
    made integer;
BEGIN
    WITH due AS (
        SELECT f.parent_id, f.released AS first,
               least(f.max_parallel - (f.released - f.ended), f.total - f.released) AS take
        FROM job_fan_outs f JOIN jobs p ON p.id = f.parent_id
        WHERE f.parent_id = ANY (p_parents) AND p.status IN ('queued', 'leased', 'waiting')
          AND f.released < f.total AND f.released - f.ended < f.max_parallel
    ), taken AS (
        DELETE FROM job_fan_out_items i USING due d
        WHERE i.parent_id = d.parent_id AND i.place >= d.first AND i.place < d.first + d.take
        RETURNING i.parent_id, i.place, i.params
    ), counted AS (
        UPDATE job_fan_outs f SET released = f.released + d.take
        FROM due d WHERE f.parent_id = d.parent_id
    ), inserted AS (
        INSERT INTO jobs (organization_id, requested_by, kind, params, max_attempts, lease_seconds,
                          request_id, parent_id, child_index, submitted_as, created_at)
        SELECT p.organization_id, p.requested_by, f.kind, t.params, f.max_attempts, f.lease_seconds,
               p.request_id, p.id, t.place, nullif(app_actor(), 'user:' || p.requested_by),
               -- the moment it is made, not its transaction's start: its birth in job_history
               -- (the chaos run dates a child made after its parent's cancel by it)
               clock_timestamp()
        FROM taken t JOIN job_fan_outs f ON f.parent_id = t.parent_id JOIN jobs p ON p.id = t.parent_id
        ORDER BY t.parent_id, t.place
        ON CONFLICT (parent_id, child_index) WHERE parent_id IS NOT NULL DO NOTHING
        RETURNING jobs.parent_id, jobs.kind
    ), moved AS (
        UPDATE job_reservations r SET reserved = r.reserved - least(r.reserved, i.n)
        FROM (SELECT c.parent_id, c.kind, count(*)::integer AS n FROM inserted c
              GROUP BY c.parent_id, c.kind) AS i
        WHERE r.parent_id = i.parent_id AND r.kind = i.kind
    )
    SELECT count(*) INTO made FROM inserted;
    RETURN made;
END $$;

CREATE OR REPLACE FUNCTION release_steps(p_parents uuid[], p_completed integer[]) RETURNS integer
LANGUAGE plpgsql SET search_path = public, pg_temp
-- As release_children(): index probes, whatever the calling trigger turned off.
SET enable_nestloop = on AS $$
DECLARE
    made integer;
BEGIN
    WITH candidates AS (
        SELECT s.parent_id, s.place, w.max_parallel - (w.released - w.ended) AS room,
               row_number() OVER (PARTITION BY s.parent_id ORDER BY s.place) AS nth
        FROM job_workflow_steps s
        JOIN job_workflows w ON w.parent_id = s.parent_id
        JOIN jobs p ON p.id = s.parent_id
        WHERE s.parent_id = ANY (p_parents) AND p.status IN ('queued', 'leased', 'waiting')
          AND (p_completed IS NULL OR w.max_parallel IS NOT NULL
               OR s.after && p_completed OR s.waits && p_completed)
          AND NOT (w.policy = 'fail_fast' AND w.failed > 0)
          AND NOT EXISTS (
                SELECT 1 FROM unnest(s.after || s.waits) AS d (place)
                LEFT JOIN jobs c ON c.parent_id = s.parent_id AND c.child_index = d.place
                LEFT JOIN job_workflow_reused u ON u.parent_id = s.parent_id AND u.place = d.place
                WHERE c.status IS DISTINCT FROM 'completed' AND u.step_id IS NULL)
    ), ready AS (
        SELECT c.parent_id, c.place FROM candidates c WHERE c.room IS NULL OR c.nth <= c.room
    ), taken AS (
        DELETE FROM job_workflow_steps s USING ready r
        WHERE s.parent_id = r.parent_id AND s.place = r.place
        RETURNING s.parent_id, s.place, s.kind, s.params, s.after, s.max_attempts, s.lease_seconds
    ), counted AS (
        UPDATE job_workflows w SET released = w.released + t.n
        FROM (SELECT parent_id, count(*)::integer AS n FROM taken GROUP BY parent_id) AS t
        WHERE w.parent_id = t.parent_id
    ), inserted AS (
        INSERT INTO jobs (organization_id, requested_by, kind, params, max_attempts, lease_seconds,
                          request_id, parent_id, child_index, submitted_as, created_at)
        SELECT p.organization_id, p.requested_by, t.kind,
               t.params || jsonb_build_object('_after', to_jsonb(t.after)),
               t.max_attempts, t.lease_seconds, p.request_id, p.id, t.place,
               nullif(app_actor(), 'user:' || p.requested_by), clock_timestamp()
        FROM taken t JOIN jobs p ON p.id = t.parent_id
        ORDER BY t.parent_id, t.place
        ON CONFLICT (parent_id, child_index) WHERE parent_id IS NOT NULL DO NOTHING
        RETURNING jobs.parent_id, jobs.kind
    ), moved AS (
        UPDATE job_reservations r SET reserved = r.reserved - least(r.reserved, i.n)
        FROM (SELECT c.parent_id, c.kind, count(*)::integer AS n FROM inserted c
              GROUP BY c.parent_id, c.kind) AS i
        WHERE r.parent_id = i.parent_id AND r.kind = i.kind
    )
    SELECT count(*) INTO made FROM inserted;
    RETURN made;
END $$;

CREATE OR REPLACE FUNCTION start_failure_handler(p_workflow uuid, p_token uuid, p_failure jsonb,
                                      p_max_attempts integer, p_lease_seconds integer)
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    workflow jobs;
    handler uuid;
BEGIN
    SELECT * INTO workflow FROM jobs j
    WHERE j.id = p_workflow AND j.lease_token = p_token
      AND j.status IN ('leased', 'cancel_requested') AND j.kind = 'workflow'
      AND jsonb_typeof(j.params -> 'on_failure' -> 'kind') = 'string'
    FOR UPDATE;
    IF workflow.id IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT h.handler_id INTO handler FROM job_failure_handlers h WHERE h.workflow_id = p_workflow;
    IF handler IS NOT NULL THEN
        RETURN handler;
    END IF;
    INSERT INTO jobs (organization_id, requested_by, kind, params, max_attempts, lease_seconds,
                      request_id, traceparent, submitted_as)
    VALUES (workflow.organization_id, workflow.requested_by,
            workflow.params -> 'on_failure' ->> 'kind',
            coalesce(workflow.params -> 'on_failure' -> 'params', '{}'::jsonb)
                || jsonb_build_object('_inputs', jsonb_build_array(p_failure)),
            least(greatest(p_max_attempts, 1), 100), least(greatest(p_lease_seconds, 1), 86400),
            workflow.request_id, workflow.traceparent,
            nullif(app_actor(), 'user:' || workflow.requested_by))
    RETURNING id INTO handler;
    INSERT INTO job_failure_handlers (workflow_id, handler_id) VALUES (p_workflow, handler);
    RETURN handler;
END $$;
