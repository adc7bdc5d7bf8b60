-- Resume and failure handling (issue 31): a failed or cancelled workflow resumed as a new one
-- that reuses the places the old run completed (job_workflow_reused, resume_workflow()), and a
-- workflow's failure handler made once when it fails (job_failure_handlers,
-- start_failure_handler()). The functions that read a workflow's places read the reused ones
-- too: release_steps(), start_workflow(), step_inputs(), children_of(); job_role_needed()
-- counts the handler's kind among what a workflow holds.

-- The jobs that resume or retry another (resume_workflow() finds a workflow's resume; the
-- foreign key's SET NULL when retention deletes the one they came from): few, so partial.
CREATE INDEX jobs_retry_of_idx ON jobs (retry_of) WHERE retry_of IS NOT NULL;

-- A resume is written to the organization's audit log.
ALTER TABLE org_audit DROP CONSTRAINT org_audit_action_check;
ALTER TABLE org_audit ADD CONSTRAINT org_audit_action_check CHECK (action IN (
    'job.submit', 'job.cancel', 'job.download', 'member.add', 'member.role_change',
    'member.remove', 'organization.state_change', 'job.debounce', 'job.resume'));

-- A resumed workflow's places that an earlier run of it completed (resume_workflow()): the
-- completed step's own job (of the workflow resumed, or of the one it resumed in turn) stands
-- for the place, whose step is never made again: its result is the place's, for the steps that
-- read it (step_inputs()), the collect (children_of()) and the lists (steps_of, step_results in
-- store.sql). Rows are never changed. They go with the resumed workflow, and with the reused
-- step when retention deletes it (past keep_jobs, as it deletes any finished step): the place is
-- then as a step of the workflow's own that retention deleted, never completed.
CREATE TABLE job_workflow_reused (
    parent_id       uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    place           integer NOT NULL CHECK (place >= 0),
    organization_id uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    step_id         uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    PRIMARY KEY (parent_id, place)
);
-- The cascade from a reused step's row when retention deletes it.
CREATE INDEX job_workflow_reused_step_idx ON job_workflow_reused (step_id);

-- Written only by resume_workflow() (as the owner); the web reads its organization's, for the
-- lists of a workflow's steps and their results.
ALTER TABLE job_workflow_reused ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_workflow_reused FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_workflow_reused TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY tenant_read ON job_workflow_reused FOR SELECT TO space_app
    USING (organization_id = app_org());
GRANT SELECT ON job_workflow_reused TO space_app;

-- The failure handler a submitted workflow declared (params -> 'on_failure'), made once per
-- workflow when it fails (start_failure_handler()): the row says which job it was, and its
-- primary key that there is only one.
CREATE TABLE job_failure_handlers (
    workflow_id uuid PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    handler_id  uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE
);
-- The cascade from the handler's row when retention deletes it.
CREATE INDEX job_failure_handlers_handler_idx ON job_failure_handlers (handler_id);
ALTER TABLE job_failure_handlers ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_failure_handlers FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_failure_handlers TO space_owner USING (true) WITH CHECK (true);

-- The steps of these workflows whose dependencies (after and waits) have all completed, made
-- now, under a parent that is not stopping, and not after a failure under fail_fast, in place
-- order and no more than max_parallel unfinished. Only steps that wait for one of p_completed
-- (places that just completed) are looked at, or all when it is NULL or the workflow has a
-- max_parallel (a step ready before may have waited for room). A step's params name the places
-- whose results it reads ("_after", replacing any such key of the caller's), not the results
-- themselves. A place an earlier run completed (job_workflow_reused) counts as completed. Each step
-- made takes the place its workflow reserved for it (submit_job(), start_workflow()). The
-- callers hold the parents' rows locked. Returns how many were made.
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
                          request_id, parent_id, child_index)
        SELECT p.organization_id, p.requested_by, t.kind,
               t.params || jsonb_build_object('_after', to_jsonb(t.after)),
               t.max_attempts, t.lease_seconds, p.request_id, p.id, t.place
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
REVOKE ALL ON FUNCTION release_steps(uuid[], integer[]) FROM PUBLIC;

-- The parent's workflow, for the worker holding its lease: its steps (place = position in the
-- arrays; p_after: each step's places as a JSON array; p_waits: the places each runs after
-- without reading their results, NULL for none), at most p_max_parallel unfinished at a
-- time (NULL: no bound), and the steps ready at once, in one transaction. Every step counts as
-- an active job from then on: the steps beyond those its submit already reserved (a kind's own
-- ctx.workflow reserved none) are admitted against the quotas first (the organization's cap is
-- the database's; p_quotas are the steps' kinds' declared ones); over a cap nothing is
-- recorded, and refused_kind and cap say which. A workflow already started is left as it is;
-- steps the parent made before, one by one (before revision 0033), count as released, and the
-- places an earlier run completed (a resumed workflow's, job_workflow_reused) as ended. Returns
-- the workflow, or no row when the lease is no longer the caller's or a cancel was asked for.
CREATE OR REPLACE FUNCTION start_workflow(p_parent uuid, p_token uuid, p_policy text, p_max_parallel integer,
                               p_kinds text[], p_params jsonb[], p_after jsonb[],
                               p_max_attempts integer[], p_lease_seconds integer[],
                               p_quotas integer[] DEFAULT NULL, p_waits jsonb[] DEFAULT NULL)
RETURNS TABLE (total integer, released integer, ended integer, failed integer,
               refused_kind text, cap integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    parent jobs;
    unreserved text[];
    unreserved_caps integer[];
    refusal record;
BEGIN
    SELECT * INTO parent FROM jobs j
    WHERE j.id = p_parent AND j.lease_token = p_token AND j.status = 'leased' FOR UPDATE;
    IF parent.id IS NULL THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM job_workflows w WHERE w.parent_id = p_parent) THEN
        -- The steps not made yet, one entry each, less those already reserved per kind.
        SELECT coalesce(array_agg(n.kind), '{}'), coalesce(array_agg(n.cap), '{}')
        INTO unreserved, unreserved_caps
        FROM (SELECT s.kind, s.cap,
                     row_number() OVER (PARTITION BY s.kind ORDER BY s.place) AS nth
              FROM unnest(p_kinds, coalesce(p_quotas, array_fill(NULL::integer,
                                                                 ARRAY[cardinality(p_kinds)])))
                       WITH ORDINALITY AS s (kind, cap, place)
              WHERE NOT EXISTS (SELECT 1 FROM jobs c
                                WHERE c.parent_id = p_parent AND c.child_index = s.place - 1)
                AND NOT EXISTS (SELECT 1 FROM job_workflow_reused u
                                WHERE u.parent_id = p_parent AND u.place = s.place - 1)
             ) AS n
        LEFT JOIN job_reservations r ON r.parent_id = p_parent AND r.kind = n.kind
        WHERE n.nth > coalesce(r.reserved, 0);
        IF cardinality(unreserved) > 0 THEN
            SELECT * INTO refusal
            FROM admit_jobs(parent.organization_id, unreserved, unreserved_caps,
                            (SELECT q.active_jobs FROM quota_policy q), false);
            IF FOUND THEN
                RETURN QUERY SELECT NULL::integer, NULL::integer, NULL::integer, NULL::integer,
                                    refusal.refused_kind, refusal.cap;
                RETURN;
            END IF;
            PERFORM reserve_children(p_parent, parent.organization_id, unreserved);
        END IF;
        INSERT INTO job_workflows (parent_id, policy, max_parallel, total, released, ended, failed)
        SELECT p_parent, p_policy,
               CASE WHEN p_max_parallel IS NOT NULL THEN greatest(p_max_parallel, 1) END,
               coalesce(cardinality(p_kinds), 0),
               count(c.id) + r.n,
               count(c.id) FILTER (WHERE c.status IN ('completed', 'failed', 'cancelled')) + r.n,
               count(c.id) FILTER (WHERE c.status IN ('failed', 'cancelled'))
        FROM (SELECT count(*)::integer AS n FROM job_workflow_reused u
              WHERE u.parent_id = p_parent) AS r
        LEFT JOIN jobs c ON c.parent_id = p_parent
        GROUP BY r.n;
        INSERT INTO job_workflow_steps (parent_id, place, kind, params, after, waits,
                                        max_attempts, lease_seconds)
        SELECT p_parent, s.place - 1, s.kind, s.params,
               ARRAY(SELECT jsonb_array_elements_text(s.after)::integer),
               ARRAY(SELECT jsonb_array_elements_text(coalesce(s.waits, '[]'))::integer),
               least(greatest(s.max_attempts, 1), 100), least(greatest(s.lease_seconds, 1), 86400)
        FROM unnest(p_kinds, p_params, p_after, p_max_attempts, p_lease_seconds,
                    coalesce(p_waits, array_fill(NULL::jsonb, ARRAY[cardinality(p_kinds)])))
                 WITH ORDINALITY AS s (kind, params, after, max_attempts, lease_seconds, waits,
                                       place)
        WHERE NOT EXISTS (SELECT 1 FROM jobs c
                          WHERE c.parent_id = p_parent AND c.child_index = s.place - 1)
          AND NOT EXISTS (SELECT 1 FROM job_workflow_reused u
                          WHERE u.parent_id = p_parent AND u.place = s.place - 1);
        PERFORM release_steps(ARRAY[p_parent], NULL);
    END IF;
    RETURN QUERY SELECT w.total, w.released, w.ended, w.failed, NULL::text, NULL::integer
    FROM job_workflows w WHERE w.parent_id = p_parent;
END $$;
REVOKE ALL ON FUNCTION start_workflow(uuid, uuid, text, integer, text[], jsonb[], jsonb[],
                                      integer[], integer[], integer[], jsonb[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION start_workflow(uuid, uuid, text, integer, text[], jsonb[], jsonb[],
                                         integer[], integer[], integer[], jsonb[]) TO space_worker;

-- A workflow step's inputs, for the worker holding the step's lease: the results of the steps
-- it waited for (the places its params name under "_after", written by release_steps()), in
-- that order (a place an earlier run completed: that step's, job_workflow_reused); a step whose
-- dependency's result was dropped by retention reads null for it.
-- held is false when the token does not hold the step's lease.
CREATE OR REPLACE FUNCTION step_inputs(p_id uuid, p_token uuid) RETURNS TABLE (held boolean, inputs jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    this_step jobs;
BEGIN
    SELECT * INTO this_step FROM jobs j
    WHERE j.id = p_id AND j.lease_token = p_token AND j.status IN ('leased', 'cancel_requested');
    IF this_step.id IS NULL THEN
        RETURN QUERY SELECT false, NULL::jsonb;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT true, coalesce(jsonb_agg(r.result ORDER BY d.ord), '[]'::jsonb)
    FROM jsonb_array_elements_text(CASE WHEN jsonb_typeof(this_step.params -> '_after') = 'array'
                                        THEN this_step.params -> '_after' ELSE '[]'::jsonb END)
             WITH ORDINALITY AS d (place, ord)
    -- index probes: the child at the place (jobs_children_idx), else the step reused there
    LEFT JOIN LATERAL (
        SELECT c.result FROM jobs c
        WHERE c.parent_id = this_step.parent_id AND c.child_index = d.place::integer
        UNION ALL
        SELECT c.result FROM job_workflow_reused u JOIN jobs c ON c.id = u.step_id
        WHERE u.parent_id = this_step.parent_id AND u.place = d.place::integer
        LIMIT 1) AS r ON true;
END $$;
REVOKE ALL ON FUNCTION step_inputs(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION step_inputs(uuid, uuid) TO space_worker;

-- The children of a parent whose lease the caller holds, in place order, with their results:
-- a parent reads what its own children produced, in its own organization, and nothing else;
-- a resumed workflow's places an earlier run completed are the steps that completed them.
CREATE OR REPLACE FUNCTION children_of(p_parent uuid, p_token uuid)
RETURNS TABLE (child_index integer, id uuid, status text, result jsonb, error_code text,
               error_message text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT c.child_index, c.id, c.status, c.result, c.error_code, c.error_message
    FROM jobs p JOIN jobs c ON c.parent_id = p.id
    WHERE p.id = p_parent AND p.lease_token = p_token AND p.status IN ('leased', 'cancel_requested')
    UNION ALL
    SELECT u.place, c.id, c.status, c.result, c.error_code, c.error_message
    FROM jobs p JOIN job_workflow_reused u ON u.parent_id = p.id JOIN jobs c ON c.id = u.step_id
    WHERE p.id = p_parent AND p.lease_token = p_token AND p.status IN ('leased', 'cancel_requested')
    ORDER BY 1
$$;
REVOKE ALL ON FUNCTION children_of(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION children_of(uuid, uuid) TO space_worker;

-- The least role a member needs to act on a job (cancel it, signal it, read its result) by the
-- role rule of each kind: the job's own kind's, and for a parent the strictest of every kind
-- it holds or will make (its children and theirs, the steps of its workflow not made yet, its
-- fan-out's kind, a submitted workflow's steps and its failure handler). A parent is never
-- easier to act on than what
-- is inside it: a plain member who may not cancel an admin's import step may not cancel the
-- workflow that holds it either, nor read the workflow's result, which carries the step's.
-- p_kind_roles: kind -> role, from the kinds' code (a kind it does not name needs an owner).
-- Only a job of the scoped organization (app_org()): NULL for any other, which every caller
-- treats as a refusal.
CREATE OR REPLACE FUNCTION job_role_needed(p_id uuid, p_kind_roles jsonb) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp
-- The planner guesses a step list's rows by the thousand, and past jit_above_cost LLVM compiled
-- this for ~2.9 s on every cancel, signal, result read and page of a 1,000-step workflow whose
-- statement itself runs in ~0.1 s.
SET jit = off AS $$
DECLARE
    needed integer;
BEGIN
    WITH RECURSIVE tree AS (
        SELECT j.id, j.kind, j.params FROM jobs j
        WHERE j.id = p_id AND j.organization_id = app_org()
        UNION ALL
        SELECT c.id, c.kind, NULL::jsonb FROM tree t JOIN jobs c ON c.parent_id = t.id
    ), kinds AS (
        SELECT t.kind FROM tree t
        UNION
        SELECT s.step ->> 'kind'
        FROM tree t, jsonb_array_elements(
                 CASE WHEN t.kind = 'workflow' AND jsonb_typeof(t.params -> 'steps') = 'array'
                      THEN t.params -> 'steps' ELSE '[]'::jsonb END) AS s (step)
        UNION
        SELECT t.params -> 'on_failure' ->> 'kind' FROM tree t
        WHERE t.kind = 'workflow' AND jsonb_typeof(t.params -> 'on_failure' -> 'kind') = 'string'
        UNION
        SELECT w.kind FROM job_workflow_steps w WHERE w.parent_id IN (SELECT t.id FROM tree t)
        UNION
        SELECT f.kind FROM job_fan_outs f WHERE f.parent_id IN (SELECT t.id FROM tree t)
    )
    SELECT max(coalesce(role_rank(p_kind_roles ->> k.kind), 3)) INTO needed FROM kinds k;
    RETURN (ARRAY['member', 'admin', 'owner'])[needed];
END $$;
REVOKE ALL ON FUNCTION job_role_needed(uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION job_role_needed(uuid, jsonb) TO space_app;

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
                      request_id, traceparent)
    VALUES (workflow.organization_id, workflow.requested_by,
            workflow.params -> 'on_failure' ->> 'kind',
            coalesce(workflow.params -> 'on_failure' -> 'params', '{}'::jsonb)
                || jsonb_build_object('_inputs', jsonb_build_array(p_failure)),
            least(greatest(p_max_attempts, 1), 100), least(greatest(p_lease_seconds, 1), 86400),
            workflow.request_id, workflow.traceparent)
    RETURNING id INTO handler;
    INSERT INTO job_failure_handlers (workflow_id, handler_id) VALUES (p_workflow, handler);
    RETURN handler;
END $$;
REVOKE ALL ON FUNCTION start_failure_handler(uuid, uuid, jsonb, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION start_failure_handler(uuid, uuid, jsonb, integer, integer)
    TO space_worker;
