-- The results store, revision 0018: a large result is a file in the store, named by
-- jobs.result_ref, which the worker's fenced finish now records (UPDATE on that one column; it
-- still reads neither result nor result_ref). Retention hands back the keys of the files it let
-- go, and the orphan sweep asks the rows about the files it finds, through two functions.

GRANT UPDATE (result_ref) ON jobs TO space_worker;

-- The orphan sweep's check of rows against the store (results_without_files): stored results only.
CREATE INDEX jobs_result_ref_idx ON jobs (finished_at) WHERE result_ref IS NOT NULL;

-- A new column in the answer: the function is replaced, its grants with it.
DROP FUNCTION purge_finished_jobs(interval, interval, interval, integer);
CREATE FUNCTION purge_finished_jobs(jobs_age interval, results_age interval, events_age interval,
                                    batch integer)
RETURNS TABLE (jobs_deleted integer, results_dropped integer, events_deleted integer,
               dropped_refs text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    refs_of_jobs text[];
    refs_of_results text[];
BEGIN
    -- Whole jobs first: their events and diagnostics go with them (ON DELETE CASCADE).
    WITH old AS (
        SELECT id FROM jobs
        WHERE finished_at < now() - jobs_age AND status IN ('completed', 'failed', 'cancelled')
        ORDER BY finished_at LIMIT batch
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs j USING old WHERE j.id = old.id RETURNING j.result_ref
    )
    SELECT count(*), array_agg(gone.result_ref) FILTER (WHERE gone.result_ref IS NOT NULL)
    INTO jobs_deleted, refs_of_jobs FROM gone;

    WITH old AS (
        SELECT id, result_ref FROM jobs
        WHERE finished_at < now() - results_age AND result IS NOT NULL
          AND result_expired_at IS NULL AND status IN ('completed', 'failed', 'cancelled')
        ORDER BY finished_at LIMIT batch
        FOR UPDATE SKIP LOCKED
    ), dropped AS (
        UPDATE jobs j SET result = NULL, result_ref = NULL, result_expired_at = now()
        FROM old WHERE j.id = old.id RETURNING old.result_ref
    )
    SELECT count(*), array_agg(dropped.result_ref) FILTER (WHERE dropped.result_ref IS NOT NULL)
    INTO results_dropped, refs_of_results FROM dropped;

    WITH old AS (
        SELECT e.id FROM jobs j JOIN job_events e ON e.job_id = j.id
        WHERE j.finished_at < now() - events_age AND j.status IN ('completed', 'failed', 'cancelled')
        ORDER BY j.finished_at LIMIT batch
    )
    DELETE FROM job_events e USING old WHERE e.id = old.id;
    GET DIAGNOSTICS events_deleted = ROW_COUNT;
    dropped_refs := coalesce(refs_of_jobs, '{}') || coalesce(refs_of_results, '{}');
    RETURN NEXT;
END $$;

-- The orphan sweep's two questions (models/results/sweep.py), asked as the owner because the
-- worker role may not read result_ref. Both take what the sweeper found in the store and answer
-- with nothing it did not know already: keys it listed itself, or job ids.
--
-- Which of these files a job still needs: its row references the file, or the job is running,
-- so the attempt that wrote it may still finish with it. A file is written before the fenced
-- finish that records it, and only a lease holder can finish: a file of a job that is not
-- running and does not reference it will never be referenced. Keys hold their job's id.
CREATE FUNCTION result_files_in_use(p_refs text[], p_job_ids uuid[]) RETURNS SETOF text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT f.ref
    FROM unnest(p_refs, p_job_ids) AS f (ref, job_id)
    JOIN jobs j ON j.id = f.job_id
    WHERE j.result_ref = f.ref OR j.status IN ('leased', 'cancel_requested')
$$;

-- Jobs whose row references a file the store does not have (p_present: every key the sweeper
-- listed, starting at p_listed_at by the database's clock). Only jobs finished before the
-- listing began: their files were written before their finish, so the listing must have seen
-- them. Ids, never refs.
CREATE FUNCTION results_without_files(p_present text[], p_listed_at timestamptz)
RETURNS TABLE (job_id uuid, organization_id uuid, kind text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT j.id, j.organization_id, j.kind FROM jobs j
    WHERE j.result_ref IS NOT NULL AND j.finished_at < p_listed_at
      AND NOT EXISTS (SELECT 1 FROM unnest(p_present) AS p (ref) WHERE p.ref = j.result_ref)
$$;

REVOKE ALL ON FUNCTION purge_finished_jobs(interval, interval, interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION purge_finished_jobs(interval, interval, interval, integer) TO space_worker;
REVOKE ALL ON FUNCTION result_files_in_use(text[], uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION result_files_in_use(text[], uuid[]) TO space_worker;
REVOKE ALL ON FUNCTION results_without_files(text[], timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION results_without_files(text[], timestamptz) TO space_worker;
