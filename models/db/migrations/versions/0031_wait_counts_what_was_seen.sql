-- wait_job() learns how many children the caller saw active, so a child that ended between
-- the caller's look and its wait resumes it at once instead of leaving it waiting.

DROP FUNCTION wait_job(uuid, uuid, timestamptz, text, boolean);

CREATE FUNCTION wait_job(p_id uuid, p_token uuid, p_until timestamptz, p_signal text,
                         p_children_seen integer)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    found_job jobs;
    active_children integer;
    met boolean;
BEGIN
    SELECT * INTO found_job FROM jobs j
    WHERE j.id = p_id AND j.lease_token = p_token AND j.status = 'leased' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF p_children_seen IS NOT NULL THEN
        SELECT count(*) INTO active_children FROM jobs c
        WHERE c.parent_id = p_id AND c.status IN ('queued', 'leased', 'cancel_requested', 'waiting');
    END IF;
    met := (p_until IS NOT NULL AND p_until <= now())
        OR (p_signal IS NOT NULL AND EXISTS (
                SELECT 1 FROM job_signals s
                WHERE s.job_id = p_id AND s.name = p_signal AND s.taken_at IS NULL))
        OR (p_children_seen IS NOT NULL
            AND (active_children = 0 OR active_children < p_children_seen))
        OR (p_until IS NULL AND p_signal IS NULL AND p_children_seen IS NULL);
    UPDATE jobs j
    SET status = CASE WHEN met THEN 'queued' ELSE 'waiting' END,
        attempts = j.attempts - 1, run_after = now(),
        lease_token = NULL, lease_until = NULL, leased_by = NULL,
        last_wakeup_at = CASE WHEN met THEN NULL ELSE now() END,
        wait_until = CASE WHEN met THEN NULL ELSE p_until END,
        wait_signal = CASE WHEN met THEN NULL ELSE p_signal END,
        wait_children = CASE WHEN met THEN NULL ELSE active_children END
    WHERE j.id = p_id;
    RETURN CASE WHEN met THEN 'queued' ELSE 'waiting' END;
END $$;
REVOKE ALL ON FUNCTION wait_job(uuid, uuid, timestamptz, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION wait_job(uuid, uuid, timestamptz, text, integer) TO space_worker;
