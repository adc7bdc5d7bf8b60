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
