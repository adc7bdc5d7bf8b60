-- Durable fan-out: a parent job's children, made and read by the worker holding its lease.

-- A fan-out the database runs for its parent (ctx.fan_out): the parent's first run records it
-- with its items (start_fan_out()), and from then on each child's end releases the next
-- child, in the transaction that ends it (fan_out_children_ended(), from the jobs trigger),
-- at most max_parallel unfinished at a time. The parent waits without a worker until the last
-- has ended, then collects: it runs twice, however many children. Places 0 .. released - 1
-- exist as jobs, the others wait as items; one fan-out per parent (the children's places are
-- unique per parent).
CREATE TABLE job_fan_outs (
    parent_id     uuid PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    kind          text NOT NULL,
    max_attempts  integer NOT NULL,
    lease_seconds integer NOT NULL,
    max_parallel  integer NOT NULL CHECK (max_parallel >= 1),
    total         integer NOT NULL CHECK (total >= 0),
    released      integer NOT NULL CHECK (released BETWEEN 0 AND total),
    ended         integer NOT NULL CHECK (ended BETWEEN 0 AND released)
);

-- The items of a fan-out not released yet, one per place (a released one is deleted: its
-- params live on in its child's row). Tenant data, read only through the functions below.
CREATE TABLE job_fan_out_items (
    parent_id uuid NOT NULL REFERENCES job_fan_outs (parent_id) ON DELETE CASCADE,
    place     integer NOT NULL CHECK (place >= 0),
    params    jsonb NOT NULL,
    PRIMARY KEY (parent_id, place)
);

-- Only the owner's functions touch them; the worker role reaches them through those.
ALTER TABLE job_fan_outs ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_fan_outs FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_fan_outs TO space_owner USING (true) WITH CHECK (true);
ALTER TABLE job_fan_out_items ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_fan_out_items FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_fan_out_items TO space_owner USING (true) WITH CHECK (true);

-- The next children of these fan-outs, as many as each has room for (max_parallel minus the
-- released ones not ended), in place order, for the parent's organization and requester (from
-- the parent's row). Nothing is released under a parent that is stopping (cancel_requested)
-- or has ended. Each child made takes the place its parent reserved for it (start_fan_out()),
-- so the organization's count of active jobs does not move. The callers hold the parents' rows
-- locked. Returns how many were made.
CREATE FUNCTION release_children(p_parents uuid[]) RETURNS integer
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
REVOKE ALL ON FUNCTION release_children(uuid[]) FROM PUBLIC;

-- Children that ended (their parents, one entry per child): each fan-out counts them, its
-- waiting parent's progress moves (in steps of 5%, so a fan-out of thousands rewrites its
-- parent's row, and runs this trigger again, at most twenty times), and the next children are
-- released. Called by the
-- jobs trigger only (as the owner), with the parents' rows locked.
CREATE FUNCTION fan_out_children_ended(p_parents uuid[]) RETURNS void
LANGUAGE plpgsql SET search_path = public, pg_temp SET enable_nestloop = on AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM job_fan_outs f WHERE f.parent_id = ANY (p_parents)) THEN
        RETURN;  -- a workflow's steps, or children made one by one
    END IF;
    WITH ended AS (
        SELECT e.parent_id, count(*)::integer AS n FROM unnest(p_parents) AS e (parent_id)
        GROUP BY e.parent_id
    ), counted AS (
        -- (least(): a child of the parent's from before its fan-out, beyond its places, is
        -- not the fan-out's to count, and must not fail the finish that ended it)
        UPDATE job_fan_outs f SET ended = least(f.ended + e.n, f.released)
        FROM ended e WHERE f.parent_id = e.parent_id
        RETURNING f.parent_id, f.ended, f.total, e.n
    )
    UPDATE jobs p
    SET progress = jsonb_build_object('stage', 'children', 'done', c.ended, 'total', c.total)
    FROM counted c
    WHERE p.id = c.parent_id AND p.status = 'waiting'
      AND (c.ended = c.total OR c.ended * 20 / c.total <> (c.ended - c.n) * 20 / c.total);
    PERFORM release_children(ARRAY(SELECT DISTINCT e.parent_id FROM unnest(p_parents) AS e (parent_id)));
END $$;
REVOKE ALL ON FUNCTION fan_out_children_ended(uuid[]) FROM PUBLIC;

-- A parent's fan-out as the worker holding its lease sees it: no row when the lease is not
-- the caller's; a row of NULLs when the parent has not started one.
CREATE FUNCTION fan_out_state(p_parent uuid, p_token uuid)
RETURNS TABLE (total integer, released integer, ended integer)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT f.total, f.released, f.ended
    FROM jobs p LEFT JOIN job_fan_outs f ON f.parent_id = p.id
    WHERE p.id = p_parent AND p.lease_token = p_token AND p.status IN ('leased', 'cancel_requested')
$$;
REVOKE ALL ON FUNCTION fan_out_state(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fan_out_state(uuid, uuid) TO space_worker;

-- The parent's fan-out, for the worker holding its lease: its items (place = position in
-- p_params) and the first children released, in one transaction. The children are admitted
-- against the quotas first, all of them (the organization's cap is the database's; p_kind_quota
-- is the kind's declared one), and counted as active from then on: over a cap, nothing is
-- recorded and refused_kind and cap say which (the caller's attempt fails, to be retried). A
-- fan-out already started (by an earlier attempt of the parent) is left as it is. Children the
-- parent made before, one by one (workers did so before revision 0033: always the first
-- places), count as released. Returns the fan-out, or no row when the lease is no longer the
-- caller's or a cancel was asked for.
CREATE FUNCTION start_fan_out(p_parent uuid, p_token uuid, p_kind text, p_params jsonb[],
                              p_max_parallel integer, p_max_attempts integer,
                              p_lease_seconds integer, p_kind_quota integer DEFAULT NULL)
RETURNS TABLE (total integer, released integer, ended integer, refused_kind text, cap integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    parent jobs;
    made integer;
    finished integer;
    refusal record;
BEGIN
    -- Locked like a child's end locks it: the counts below and the trigger's never cross.
    SELECT * INTO parent FROM jobs j
    WHERE j.id = p_parent AND j.lease_token = p_token AND j.status = 'leased' FOR UPDATE;
    IF parent.id IS NULL THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM job_fan_outs f WHERE f.parent_id = p_parent) THEN
        SELECT count(*), count(*) FILTER (WHERE c.status IN ('completed', 'failed', 'cancelled'))
        INTO made, finished
        FROM jobs c WHERE c.parent_id = p_parent;
        made := least(made, coalesce(cardinality(p_params), 0));
        IF coalesce(cardinality(p_params), 0) > made THEN
            SELECT * INTO refusal
            FROM admit_jobs(parent.organization_id,
                            array_fill(p_kind, ARRAY[cardinality(p_params) - made]),
                            array_fill(p_kind_quota, ARRAY[cardinality(p_params) - made]),
                            (SELECT q.active_jobs FROM quota_policy q), false);
            IF FOUND THEN
                RETURN QUERY SELECT NULL::integer, NULL::integer, NULL::integer,
                                    refusal.refused_kind, refusal.cap;
                RETURN;
            END IF;
            PERFORM reserve_children(p_parent, parent.organization_id,
                                     array_fill(p_kind, ARRAY[cardinality(p_params) - made]));
        END IF;
        INSERT INTO job_fan_outs (parent_id, kind, max_attempts, lease_seconds, max_parallel,
                                  total, released, ended)
        VALUES (p_parent, p_kind, least(greatest(p_max_attempts, 1), 100),
                least(greatest(p_lease_seconds, 1), 86400), greatest(p_max_parallel, 1),
                coalesce(cardinality(p_params), 0), made, least(finished, made));
        INSERT INTO job_fan_out_items (parent_id, place, params)
        SELECT p_parent, c.place - 1, c.params
        FROM unnest(p_params) WITH ORDINALITY AS c (params, place)
        WHERE c.place > made;
        PERFORM release_children(ARRAY[p_parent]);
    END IF;
    RETURN QUERY SELECT f.total, f.released, f.ended, NULL::text, NULL::integer
    FROM job_fan_outs f WHERE f.parent_id = p_parent;
END $$;
REVOKE ALL ON FUNCTION start_fan_out(uuid, uuid, text, jsonb[], integer, integer, integer, integer)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION start_fan_out(uuid, uuid, text, jsonb[], integer, integer, integer,
                                        integer)
    TO space_worker;

-- A workflow the database runs (models/jobs/workflows.py): its steps not made yet, each with
-- the places it waits for; the end of a step makes, in the transaction that ends it, every
-- step whose dependencies have all completed, its params naming their places (under "_after",
-- workflows.AFTER, in the order of its dependencies): the step reads their results when it
-- runs (step_inputs()), so a step's row holds a few numbers, never copies of results. The
-- workflow waits without a worker until it is settled: nothing left unfinished, or, with
-- fail_fast, a step that did not complete. So a chain's next step is made in its predecessor's
-- finish, with no run of the workflow in between.
CREATE TABLE job_workflows (
    parent_id    uuid PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    policy       text NOT NULL CHECK (policy IN ('fail_fast', 'run_all')),
    -- at most this many steps unfinished at a time (NULL: every step as soon as it is ready)
    max_parallel integer CHECK (max_parallel >= 1),
    total     integer NOT NULL CHECK (total >= 0),
    released  integer NOT NULL CHECK (released BETWEEN 0 AND total),
    ended     integer NOT NULL CHECK (ended BETWEEN 0 AND released),
    failed    integer NOT NULL CHECK (failed BETWEEN 0 AND ended)
);

CREATE TABLE job_workflow_steps (
    parent_id     uuid NOT NULL REFERENCES job_workflows (parent_id) ON DELETE CASCADE,
    place         integer NOT NULL CHECK (place >= 0),
    kind          text NOT NULL,
    params        jsonb NOT NULL,
    after         integer[] NOT NULL,
    max_attempts  integer NOT NULL,
    lease_seconds integer NOT NULL,
    -- places it runs after without reading their results (what came before an empty group)
    waits         integer[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (parent_id, place)
);

ALTER TABLE job_workflows ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_workflows FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_workflows TO space_owner USING (true) WITH CHECK (true);
ALTER TABLE job_workflow_steps ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_workflow_steps FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_workflow_steps TO space_owner USING (true) WITH CHECK (true);

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
CREATE FUNCTION release_steps(p_parents uuid[], p_completed integer[]) RETURNS integer
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
REVOKE ALL ON FUNCTION release_steps(uuid[], integer[]) FROM PUBLIC;

-- Steps that ended (their parents, their places and whether each completed, one entry per
-- step): each workflow counts them, its waiting parent's progress moves (in steps of 5%), and
-- the steps now ready are made. Called by the jobs trigger only (as the owner), the parents
-- locked.
CREATE FUNCTION workflow_steps_ended(p_parents uuid[], p_places integer[], p_completed boolean[])
RETURNS void
LANGUAGE plpgsql SET search_path = public, pg_temp SET enable_nestloop = on AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM job_workflows w WHERE w.parent_id = ANY (p_parents)) THEN
        RETURN;  -- a fan-out's children, or children made one by one
    END IF;
    WITH ended AS (
        SELECT e.parent_id, count(*)::integer AS n,
               count(*) FILTER (WHERE NOT e.completed)::integer AS failed
        FROM unnest(p_parents, p_completed) AS e (parent_id, completed)
        GROUP BY e.parent_id
    ), counted AS (
        UPDATE job_workflows w
        SET ended = least(w.ended + e.n, w.released),
            failed = least(w.failed + e.failed, least(w.ended + e.n, w.released))
        FROM ended e WHERE w.parent_id = e.parent_id
        RETURNING w.parent_id, w.ended, w.total, e.n
    )
    UPDATE jobs p
    SET progress = jsonb_build_object('stage', 'steps', 'done', c.ended, 'total', c.total)
    FROM counted c
    WHERE p.id = c.parent_id AND p.status = 'waiting'
      AND (c.ended = c.total OR c.ended * 20 / c.total <> (c.ended - c.n) * 20 / c.total);
    PERFORM release_steps(ARRAY(SELECT DISTINCT e.parent_id FROM unnest(p_parents) AS e (parent_id)),
                          ARRAY(SELECT e.place FROM unnest(p_places, p_completed) AS e (place, completed)
                                WHERE e.completed));
END $$;
REVOKE ALL ON FUNCTION workflow_steps_ended(uuid[], integer[], boolean[]) FROM PUBLIC;

-- A parent's workflow as the worker holding its lease sees it: no row when the lease is not
-- the caller's; a row of NULLs when it has not started one.
CREATE FUNCTION workflow_state(p_parent uuid, p_token uuid)
RETURNS TABLE (total integer, released integer, ended integer, failed integer)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT w.total, w.released, w.ended, w.failed
    FROM jobs p LEFT JOIN job_workflows w ON w.parent_id = p.id
    WHERE p.id = p_parent AND p.lease_token = p_token AND p.status IN ('leased', 'cancel_requested')
$$;
REVOKE ALL ON FUNCTION workflow_state(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION workflow_state(uuid, uuid) TO space_worker;

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
CREATE FUNCTION start_workflow(p_parent uuid, p_token uuid, p_policy text, p_max_parallel integer,
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
CREATE FUNCTION step_inputs(p_id uuid, p_token uuid) RETURNS TABLE (held boolean, inputs jsonb)
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
CREATE FUNCTION children_of(p_parent uuid, p_token uuid)
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

-- The children of parents that were cancelled or asked to stop: queued and waiting ones end at
-- once, running ones are asked to stop, as a user's cancel would, by whoever asked for the
-- parent's. Called by the jobs trigger only (as the owner), which runs again for these children
-- and so stops the whole tree. The cancels lock the tree from its leaves up first
-- (lock_for_cancel in store.sql, lock_tree()), the order a child's finish locks it and then its
-- parent.
CREATE FUNCTION stop_children(p_parents uuid[]) RETURNS void
LANGUAGE plpgsql SET search_path = public, pg_temp
-- Index probes by parent, whatever the calling trigger turned off.
SET enable_nestloop = on AS $$
BEGIN
    UPDATE jobs c
    SET status = CASE WHEN c.status IN ('queued', 'waiting') THEN 'cancelled'
                      ELSE 'cancel_requested' END,
        cancel_requested_at = now(), cancel_requested_by = p.cancel_requested_by
    FROM jobs p
    WHERE p.id = ANY (p_parents) AND c.parent_id = p.id
      AND c.status IN ('queued', 'leased', 'waiting');
END $$;
REVOKE ALL ON FUNCTION stop_children(uuid[]) FROM PUBLIC;

-- A job and its tree of unfinished jobs below it, locked from the leaves up, in id order at
-- each depth: a child's finish locks the child and then its parent (the jobs trigger), so a
-- cancel, which will stop the whole tree (stop_children()), takes the same order and the two
-- never deadlock. With the caller's rights: the web's cancel (store.sql, lock_for_cancel) locks
-- only what its organization's row-level security shows it.
CREATE FUNCTION lock_tree(p_root uuid) RETURNS void
LANGUAGE plpgsql SET search_path = public, pg_temp SET enable_nestloop = on AS $$
BEGIN
    PERFORM 1
    FROM jobs j
    JOIN (WITH RECURSIVE tree AS (
              SELECT p_root AS id, 0 AS depth
              UNION ALL
              SELECT c.id, t.depth + 1 FROM tree t JOIN jobs c ON c.parent_id = t.id
              WHERE c.status IN ('queued', 'leased', 'cancel_requested', 'waiting')
          ) SELECT tree.id, tree.depth FROM tree) AS t ON t.id = j.id
    ORDER BY t.depth DESC, j.id
    FOR NO KEY UPDATE OF j;
END $$;
REVOKE ALL ON FUNCTION lock_tree(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_tree(uuid) TO space_app;

-- A cancelled parent's children: queued and waiting ones end at once, running ones are asked to
-- stop, as a user's cancel would, and theirs after them (the jobs trigger, stop_children()).
-- For the worker holding the parent's lease. Returns how many children it touched.
CREATE FUNCTION cancel_children(p_parent uuid, p_token uuid) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    touched integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM jobs p WHERE p.id = p_parent AND p.lease_token = p_token
                                          AND p.status IN ('leased', 'cancel_requested')) THEN
        RETURN 0;
    END IF;
    PERFORM lock_tree(p_parent);
    UPDATE jobs c
    SET status = CASE WHEN c.status IN ('queued', 'waiting') THEN 'cancelled'
                      ELSE 'cancel_requested' END,
        cancel_requested_at = now(), cancel_requested_by = p.cancel_requested_by
    FROM jobs p
    WHERE p.id = p_parent AND p.lease_token = p_token
      AND p.status IN ('leased', 'cancel_requested')
      AND c.parent_id = p.id AND c.status IN ('queued', 'leased', 'waiting');
    GET DIAGNOSTICS touched = ROW_COUNT;
    RETURN touched;
END $$;
REVOKE ALL ON FUNCTION cancel_children(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cancel_children(uuid, uuid) TO space_worker;

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
CREATE FUNCTION job_role_needed(p_id uuid, p_kind_roles jsonb) RETURNS text
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
