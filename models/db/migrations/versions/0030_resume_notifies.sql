-- A waiting job the sweeper resumes is announced to the workers that LISTEN, as a submit is.

CREATE OR REPLACE FUNCTION resume_due_waits(p_batch integer)
RETURNS TABLE (id uuid, kind text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    RETURN QUERY
    WITH due AS (
        SELECT j.id FROM jobs j
        WHERE j.status = 'waiting'
          AND ((j.wait_until IS NOT NULL AND j.wait_until <= now())
               OR (j.wait_children IS NOT NULL AND j.wait_children > (
                       SELECT count(*) FROM jobs c
                       WHERE c.parent_id = j.id
                         AND c.status IN ('queued', 'leased', 'cancel_requested', 'waiting'))))
        ORDER BY j.wait_until NULLS LAST
        LIMIT least(greatest(p_batch, 1), 10000)
        FOR UPDATE SKIP LOCKED
    )
    UPDATE jobs j SET status = 'queued', run_after = now(), last_wakeup_at = now()
    FROM due WHERE j.id = due.id
    RETURNING j.id, j.kind;
    -- A lingering worker hears it at COMMIT without waiting for the sweeper's wake-up.
    IF FOUND THEN
        PERFORM pg_notify('spacejobs_jobs', '');
    END IF;
END $$;
REVOKE ALL ON FUNCTION resume_due_waits(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION resume_due_waits(integer) TO space_worker;
