-- A parent's steps as its organization's members see them (a job's page, GET …/jobs/{id}/steps):
-- the children that are jobs are read under the web role's own row-level security; what the
-- database keeps of the children not made yet is the owner's alone, so its places and kinds
-- come through the function below.

-- The places of a parent's children that are not jobs yet, with their kinds: the steps of a
-- kind's own workflow waiting in job_workflow_steps, a fan-out's items not released yet. Never
-- their params (tenant data the lists show nothing of), only a place and a kind. total: how many
-- children the parent's plan holds in all, made or not (NULL: it has no plan, only the children
-- it made, or none). The places after p_after, at most p_limit (1 to 1000) of them, in order. A
-- parent of the scoped organization only (app_org()): nothing of any other.
CREATE FUNCTION job_unmade_steps(p_parent uuid, p_after integer, p_limit integer)
RETURNS TABLE (total integer, places integer[], kinds text[])
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    WITH parent AS (
        SELECT j.id FROM jobs j WHERE j.id = p_parent AND j.organization_id = app_org()
    ), unmade AS (
        SELECT s.place, s.kind
        FROM parent JOIN job_workflow_steps s ON s.parent_id = parent.id
        WHERE s.place > p_after
        UNION ALL
        SELECT i.place, f.kind
        FROM parent JOIN job_fan_outs f ON f.parent_id = parent.id
        JOIN job_fan_out_items i ON i.parent_id = f.parent_id
        WHERE i.place > p_after
        ORDER BY 1
        LIMIT least(greatest(p_limit, 1), 1000)
    )
    SELECT (SELECT coalesce(w.total, f.total) FROM parent
            LEFT JOIN job_workflows w ON w.parent_id = parent.id
            LEFT JOIN job_fan_outs f ON f.parent_id = parent.id),
           coalesce((SELECT array_agg(u.place ORDER BY u.place) FROM unmade u), '{}'),
           coalesce((SELECT array_agg(u.kind ORDER BY u.place) FROM unmade u), '{}')
$$;
REVOKE ALL ON FUNCTION job_unmade_steps(uuid, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION job_unmade_steps(uuid, integer, integer) TO space_app;

-- A failed or cancelled workflow resumed as a NEW workflow (p_new: the caller's submit of the
-- same params in this transaction, retry_of p_old, not started): a terminal row never comes
-- back (40_job_transitions.sql), so the history of the run that failed stays as it was, and the
-- new one says where it came from. Each place the old run completed (its own completed steps,
-- and those it reused in turn) is reused by the new one (job_workflow_reused), whose steps
-- there are never made, so never run again; what the submit reserved for them is given back.
-- Who may: exactly who may cancel the old one (request_cancel in store.sql): a current member
-- of a live organization who started it or holds the strictest role of what it holds
-- (job_role_needed()). The same statement writes the organization's audit log (job.resume,
-- the new workflow's id, the old one's as retry_of). A workflow is resumed once: its resume
-- may be resumed in turn. Only a workflow of the scoped organization (app_org()). outcome:
-- resumed, not_found, refused, not_resumable (status says why) or already_resumed (resumed_as
-- names the resume).
CREATE FUNCTION resume_workflow(p_old uuid, p_new uuid, p_user uuid, p_kind_roles jsonb,
                                p_request_id text)
RETURNS TABLE (outcome text, status text, reused integer, resumed_as uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    old jobs;
    other uuid;
    made integer;
BEGIN
    -- Locked: two resumes of one workflow take turns, and the second sees the first's.
    SELECT * INTO old FROM jobs j WHERE j.id = p_old AND j.organization_id = app_org() FOR UPDATE;
    IF old.id IS NULL THEN
        RETURN QUERY SELECT 'not_found', NULL::text, 0, NULL::uuid;
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM memberships m JOIN organizations o ON o.id = m.organization_id
                   WHERE m.organization_id = old.organization_id AND m.user_id = p_user
                     AND o.state <> 'deleted'
                     AND (old.requested_by = p_user
                          OR role_rank(m.role) >= role_rank(job_role_needed(old.id, p_kind_roles))))
    THEN
        RETURN QUERY SELECT 'refused', old.status, 0, NULL::uuid;
        RETURN;
    END IF;
    IF old.kind <> 'workflow' OR old.status NOT IN ('failed', 'cancelled') THEN
        RETURN QUERY SELECT 'not_resumable', old.status, 0, NULL::uuid;
        RETURN;
    END IF;
    SELECT j.id INTO other FROM jobs j WHERE j.retry_of = p_old AND j.id <> p_new LIMIT 1;
    IF other IS NOT NULL THEN
        RETURN QUERY SELECT 'already_resumed', old.status, 0, other;
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM jobs n
                   WHERE n.id = p_new AND n.organization_id = old.organization_id
                     AND n.kind = 'workflow' AND n.status = 'queued' AND n.attempts = 0
                     AND n.retry_of = p_old AND n.params = old.params)
       OR EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = p_new)
       OR EXISTS (SELECT 1 FROM job_workflow_reused u WHERE u.parent_id = p_new) THEN
        RAISE EXCEPTION 'job % is not a fresh resume of workflow %', p_new, p_old
            USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO job_workflow_reused (parent_id, place, organization_id, step_id)
    SELECT p_new, c.child_index, old.organization_id, c.id
    FROM jobs c WHERE c.parent_id = p_old AND c.status = 'completed'
    UNION ALL
    SELECT p_new, u.place, old.organization_id, u.step_id
    FROM job_workflow_reused u WHERE u.parent_id = p_old;
    GET DIAGNOSTICS made = ROW_COUNT;
    UPDATE job_reservations r SET reserved = r.reserved - least(r.reserved, k.n)
    FROM (SELECT s.step ->> 'kind' AS kind, count(*)::integer AS n
          FROM job_workflow_reused u
          JOIN jsonb_array_elements(old.params -> 'steps') WITH ORDINALITY AS s (step, place)
            ON s.place - 1 = u.place
          WHERE u.parent_id = p_new
          GROUP BY 1) AS k
    WHERE r.parent_id = p_new AND r.kind = k.kind;
    INSERT INTO org_audit (organization_id, actor_id, actor, action, job_id, detail, request_id)
    VALUES (old.organization_id, p_user, coalesce(app_actor(), 'user:' || p_user), 'job.resume',
            p_new, jsonb_build_object('kind', old.kind, 'retry_of', p_old, 'status', old.status),
            p_request_id);
    RETURN QUERY SELECT 'resumed', old.status, made, p_new;
END $$;
REVOKE ALL ON FUNCTION resume_workflow(uuid, uuid, uuid, jsonb, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION resume_workflow(uuid, uuid, uuid, jsonb, text) TO space_app;

-- A failed workflow's failure handler (its params' on_failure: a kind and its params, checked
-- at its submit like a step), made once, for the worker holding the workflow's lease as it
-- fails: a job of its own (no parent: the workflow's end does not wait for it, nor does its
-- outcome change the workflow's), in the workflow's organization, by its requester, with the
-- handler's params and, under "_inputs" (canvas.INPUTS: the kind reads it as ctx.inputs[0]),
-- p_failure: what failed, which the worker builds from the workflow's own steps (places,
-- names, kinds, statuses, error codes; never a result). Born queued like any job, and run
-- with its own kind's check of the requester's role and the organization's state. The kind
-- and params are read from the workflow's row, never taken from the caller: a worker makes
-- only the handler its workflow declared. Returns the handler's id (the one made before, if
-- any: once per workflow), NULL when the lease is not the caller's or there is no handler.
CREATE FUNCTION start_failure_handler(p_workflow uuid, p_token uuid, p_failure jsonb,
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
REVOKE ALL ON FUNCTION start_failure_handler(uuid, uuid, jsonb, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION start_failure_handler(uuid, uuid, jsonb, integer, integer)
    TO space_worker;
