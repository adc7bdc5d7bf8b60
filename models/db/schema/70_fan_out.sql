-- Durable fan-out: a parent job's children, made and read by the worker holding its lease.

-- Children, for the worker holding the PARENT's lease: they belong to the parent's organization
-- and requester (taken from the parent's row, never from the caller), are born queued like any
-- job, and the places already taken are skipped. Returns how many were created.
CREATE FUNCTION spawn_children(p_parent uuid, p_token uuid, p_kind text, p_indexes integer[],
                               p_params jsonb[], p_max_attempts integer, p_lease_seconds integer)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    parent jobs;
    created integer;
BEGIN
    SELECT * INTO parent FROM jobs j
    WHERE j.id = p_parent AND j.lease_token = p_token AND j.status = 'leased';
    IF NOT FOUND THEN
        -- The lease is no longer the caller's (a newer attempt spawns, not this one), or a
        -- cancel was asked for: nothing new starts under a parent that is stopping.
        RETURN 0;
    END IF;
    INSERT INTO jobs (organization_id, requested_by, kind, params, max_attempts, lease_seconds,
                      request_id, parent_id, child_index)
    SELECT parent.organization_id, parent.requested_by, p_kind, c.params,
           least(greatest(p_max_attempts, 1), 100), least(greatest(p_lease_seconds, 1), 86400),
           parent.request_id, parent.id, c.place
    FROM unnest(p_indexes, p_params) AS c (place, params)
    ON CONFLICT (parent_id, child_index) WHERE parent_id IS NOT NULL DO NOTHING;
    GET DIAGNOSTICS created = ROW_COUNT;
    RETURN created;
END $$;
REVOKE ALL ON FUNCTION spawn_children(uuid, uuid, text, integer[], jsonb[], integer, integer)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION spawn_children(uuid, uuid, text, integer[], jsonb[], integer, integer)
    TO space_worker;

-- The children of a parent whose lease the caller holds, in place order, with their results:
-- a parent reads what its own children produced, in its own organization, and nothing else.
CREATE FUNCTION children_of(p_parent uuid, p_token uuid)
RETURNS TABLE (child_index integer, id uuid, status text, result jsonb, error_code text,
               error_message text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT c.child_index, c.id, c.status, c.result, c.error_code, c.error_message
    FROM jobs p JOIN jobs c ON c.parent_id = p.id
    WHERE p.id = p_parent AND p.lease_token = p_token AND p.status IN ('leased', 'cancel_requested')
    ORDER BY c.child_index
$$;
REVOKE ALL ON FUNCTION children_of(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION children_of(uuid, uuid) TO space_worker;

-- A cancelled parent's children: queued and waiting ones end at once, running ones are asked to stop, as a
-- user's cancel would. For the worker holding the parent's lease. Returns how many it touched.
CREATE FUNCTION cancel_children(p_parent uuid, p_token uuid) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    touched integer;
BEGIN
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
