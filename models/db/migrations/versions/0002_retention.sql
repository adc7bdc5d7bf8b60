-- Retention, revision 0002. Finished jobs, their events and their results are deleted by age,
-- in bounded batches, by the sweeper. The purge runs as the owner (SECURITY DEFINER) because
-- it must see every organization's events, which the worker role may not read; only the
-- worker role may call it, and it touches nothing that is not finished.

-- jobs.result_expired_at and the trigger's one exception for it are in schema.sql (0001).

CREATE INDEX jobs_result_retention_idx ON jobs (finished_at)
    WHERE result IS NOT NULL AND result_expired_at IS NULL;

CREATE FUNCTION purge_finished_jobs(jobs_age interval, results_age interval, events_age interval,
                                    batch integer)
RETURNS TABLE (jobs_deleted integer, results_dropped integer, events_deleted integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    -- Whole jobs first: their events and diagnostics go with them (ON DELETE CASCADE).
    WITH old AS (
        SELECT id FROM jobs
        WHERE finished_at < now() - jobs_age AND status IN ('completed', 'failed', 'cancelled')
        ORDER BY finished_at LIMIT batch
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM jobs j USING old WHERE j.id = old.id;
    GET DIAGNOSTICS jobs_deleted = ROW_COUNT;

    WITH old AS (
        SELECT id FROM jobs
        WHERE finished_at < now() - results_age AND result IS NOT NULL
          AND result_expired_at IS NULL AND status IN ('completed', 'failed', 'cancelled')
        ORDER BY finished_at LIMIT batch
        FOR UPDATE SKIP LOCKED
    )
    UPDATE jobs j SET result = NULL, result_ref = NULL, result_expired_at = now()
    FROM old WHERE j.id = old.id;
    GET DIAGNOSTICS results_dropped = ROW_COUNT;

    WITH old AS (
        SELECT e.id FROM jobs j JOIN job_events e ON e.job_id = j.id
        WHERE j.finished_at < now() - events_age AND j.status IN ('completed', 'failed', 'cancelled')
        ORDER BY j.finished_at LIMIT batch
    )
    DELETE FROM job_events e USING old WHERE e.id = old.id;
    GET DIAGNOSTICS events_deleted = ROW_COUNT;
    RETURN NEXT;
END $$;

REVOKE ALL ON FUNCTION purge_finished_jobs(interval, interval, interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION purge_finished_jobs(interval, interval, interval, integer) TO space_worker;
