-- Retention is a policy the database holds. The purge functions used to take their ages from
-- the caller, and the worker role may call them: a worker host's credentials could delete every
-- finished job and the whole audit log, minutes old. Now the ages live in retention_policy,
-- which only the owner writes (`spacejobs retention set`, `spacejobs db upgrade`), and the
-- sweeper says only how many rows one call may touch.

CREATE TABLE retention_policy (
    -- one row: the policy of this database
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    keep_jobs     interval NOT NULL DEFAULT interval '30 days' CHECK (keep_jobs > interval '0'),
    keep_results  interval NOT NULL DEFAULT interval '7 days' CHECK (keep_results > interval '0'),
    keep_events   interval NOT NULL DEFAULT interval '30 days' CHECK (keep_events > interval '0'),
    keep_audit    interval NOT NULL DEFAULT interval '365 days' CHECK (keep_audit > interval '0'),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
INSERT INTO retention_policy DEFAULT VALUES;

DROP FUNCTION purge_finished_jobs(interval, interval, interval, integer);
DROP FUNCTION purge_org_audit(interval, integer);

-- Finished jobs, their events and their results are deleted past the policy's ages, in bounded
-- batches, by the sweeper. As the owner (SECURITY DEFINER) because it must see every
-- organization's events, which the worker role may not read. A hostile caller chooses only the
-- batch (capped): it cannot make anything go sooner than the policy says, and it touches
-- nothing that is not finished (the transition trigger allows exactly one change to a finished
-- row: dropping its result). A result in the results store is a file the database cannot
-- delete: the keys of the files it let go come back in dropped_refs, and the sweeper deletes
-- those files once this has committed (the orphan sweep catches any it missed).
CREATE FUNCTION purge_finished_jobs(batch integer)
RETURNS TABLE (jobs_deleted integer, results_dropped integer, events_deleted integer,
               dropped_refs text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    policy retention_policy;
    n CONSTANT integer := least(greatest(batch, 0), 10000);
    refs_of_jobs text[];
    refs_of_results text[];
BEGIN
    SELECT * INTO STRICT policy FROM retention_policy;
    -- Whole jobs first: their events and diagnostics go with them.
    WITH old AS (
        SELECT id FROM jobs
        WHERE finished_at < now() - policy.keep_jobs AND status IN ('completed', 'failed', 'cancelled')
        ORDER BY finished_at LIMIT n
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs j USING old WHERE j.id = old.id RETURNING j.result_ref
    )
    SELECT count(*), array_agg(gone.result_ref) FILTER (WHERE gone.result_ref IS NOT NULL)
    INTO jobs_deleted, refs_of_jobs FROM gone;

    WITH old AS (
        SELECT id, result_ref FROM jobs
        WHERE finished_at < now() - policy.keep_results AND result IS NOT NULL
          AND result_expired_at IS NULL AND status IN ('completed', 'failed', 'cancelled')
        ORDER BY finished_at LIMIT n
        FOR UPDATE SKIP LOCKED
    ), dropped AS (
        UPDATE jobs j SET result = NULL, result_ref = NULL, result_expired_at = now()
        FROM old WHERE j.id = old.id RETURNING old.result_ref
    )
    SELECT count(*), array_agg(dropped.result_ref) FILTER (WHERE dropped.result_ref IS NOT NULL)
    INTO results_dropped, refs_of_results FROM dropped;

    WITH old AS (
        SELECT e.id FROM jobs j JOIN job_events e ON e.job_id = j.id
        WHERE j.finished_at < now() - policy.keep_events
          AND j.status IN ('completed', 'failed', 'cancelled')
        ORDER BY j.finished_at LIMIT n
    )
    DELETE FROM job_events e USING old WHERE e.id = old.id;
    GET DIAGNOSTICS events_deleted = ROW_COUNT;
    dropped_refs := coalesce(refs_of_jobs, '{}') || coalesce(refs_of_results, '{}');
    RETURN NEXT;
END $$;

-- Retention of the audit log past the policy's age, in bounded batches, by the sweeper. As the
-- owner: no application role may delete an entry, and a caller chooses only the batch.
CREATE FUNCTION purge_org_audit(batch integer) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    WITH old AS (
        SELECT a.id FROM org_audit a
        WHERE a.at < now() - (SELECT p.keep_audit FROM retention_policy p)
        LIMIT least(greatest(batch, 0), 10000) FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM org_audit a USING old WHERE a.id = old.id RETURNING 1
    )
    SELECT count(*)::integer FROM gone
$$;

REVOKE ALL ON FUNCTION purge_finished_jobs(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION purge_finished_jobs(integer) TO space_worker;
REVOKE ALL ON FUNCTION purge_org_audit(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION purge_org_audit(integer) TO space_worker;
