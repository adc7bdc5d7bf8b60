-- resume_due_timers(): the timers alone (a range of jobs_waiting_idx), which beat runs on its
-- short cadence, SPACEJOBS_TIMER_INTERVAL, between the full sweeps.

CREATE FUNCTION resume_due_timers(p_batch integer)
RETURNS TABLE (id uuid, kind text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    RETURN QUERY
    WITH due AS (
        SELECT j.id FROM jobs j
        WHERE j.status = 'waiting' AND j.wait_until <= now()
        ORDER BY j.wait_until
        LIMIT least(greatest(p_batch, 1), 10000)
        FOR UPDATE SKIP LOCKED
    )
    UPDATE jobs j SET status = 'queued', run_after = now(), last_wakeup_at = now()
    FROM due WHERE j.id = due.id
    RETURNING j.id, j.kind;
    -- A lingering worker hears it at COMMIT without waiting for beat's wake-up.
    IF FOUND THEN
        PERFORM pg_notify('spacejobs_jobs', '');
    END IF;
END $$;
REVOKE ALL ON FUNCTION resume_due_timers(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION resume_due_timers(integer) TO space_worker;
