-- A workflow step's inputs are read when it runs (step_inputs()), not copied into its params:
-- release_steps() names the places of a step's dependencies ("_after") instead of embedding
-- their results, so a workflow's storage grows with its edges, not with the square of its steps.

-- The steps of these workflows whose dependencies have all completed, made now, under a
-- parent that is not stopping, and not after a failure under fail_fast, in place order and no
-- more than max_parallel unfinished. Only steps that wait for one of p_completed (places that
-- just completed) are looked at, or all when it is NULL or the workflow has a max_parallel
-- (a step ready before may have waited for room). A step's params name the places of its
-- dependencies ("_after", replacing any such key of the caller's), not their results. Each step
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
          AND (p_completed IS NULL OR w.max_parallel IS NOT NULL OR s.after && p_completed)
          AND NOT (w.policy = 'fail_fast' AND w.failed > 0)
          AND NOT EXISTS (
                SELECT 1 FROM unnest(s.after) AS d (place)
                LEFT JOIN jobs c ON c.parent_id = s.parent_id AND c.child_index = d.place
                WHERE c.status IS DISTINCT FROM 'completed')
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

-- A workflow step's inputs, for the worker holding the step's lease: the results of the steps
-- it waited for (the places its params name under "_after", written by release_steps()), in
-- that order; a step whose dependency's result was dropped by retention reads null for it.
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
    SELECT true, coalesce(jsonb_agg(c.result ORDER BY d.ord), '[]'::jsonb)
    FROM jsonb_array_elements_text(CASE WHEN jsonb_typeof(this_step.params -> '_after') = 'array'
                                        THEN this_step.params -> '_after' ELSE '[]'::jsonb END)
             WITH ORDINALITY AS d (place, ord)
    LEFT JOIN jobs c ON c.parent_id = this_step.parent_id AND c.child_index = d.place::integer;
END $$;
REVOKE ALL ON FUNCTION step_inputs(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION step_inputs(uuid, uuid) TO space_worker;

