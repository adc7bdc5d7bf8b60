-- Retention: the policy the database holds, and the purges and orphan-sweep questions that
-- apply it, each called by the sweeper (as the worker role) with only a batch size.

-- Retention is a policy the database holds: the ages below, which only the owner writes
-- (`spacejobs retention set`, and `spacejobs db upgrade` from SPACEJOBS_KEEP_*). The purge
-- functions read them; their caller, the sweeper as the worker role, chooses only a batch size,
-- so worker credentials cannot make history go sooner.
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

-- Finished jobs, their events and their results are deleted past the policy's ages, in bounded
-- batches, by the sweeper. As the owner (SECURITY DEFINER) because it must see every
-- organization's events, which the worker role may not read. A hostile caller chooses only the
-- batch (capped) and where each step starts: it cannot make anything go sooner than the policy
-- says, and it touches nothing that is not finished (the transition trigger allows exactly one
-- change to a finished row: dropping its result). A result in the results store is a file the
-- database cannot delete: the keys of the files it let go come back in dropped_refs, and the
-- sweeper deletes those files once this has committed (the orphan sweep catches any it missed).
--
-- Each step reads jobs finished from its p_*_from on (NULL: from the first) and answers where
-- the next may start (*_from): the policy's cutoff when the step caught up, else the finish time
-- of the last job it took (ties included again). Behind a long-open transaction the index of
-- finish times keeps an entry for every job purged since it began, and a walk from its
-- beginning read them all, every batch. A job finished before a step's horizon that the step
-- did not take (committed later than the run, or locked by another sweeper that then rolled
-- back) waits for a run from the first, which the sweeper makes every so often.
CREATE FUNCTION purge_finished_jobs(batch integer, p_jobs_from timestamptz,
                                    p_results_from timestamptz, p_events_from timestamptz)
RETURNS TABLE (jobs_deleted integer, results_dropped integer, events_deleted integer,
               dropped_refs text[], jobs_from timestamptz, results_from timestamptz,
               events_from timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    policy retention_policy;
    n CONSTANT integer := least(greatest(batch, 0), 10000);
    refs_of_jobs text[];
    refs_of_results text[];
    last_taken timestamptz;
BEGIN
    SELECT * INTO STRICT policy FROM retention_policy;
    -- Whole jobs first: their events and diagnostics go with them.
    WITH old AS (
        SELECT id FROM jobs
        WHERE finished_at < now() - policy.keep_jobs
          AND finished_at >= coalesce(p_jobs_from, '-infinity')
          AND status IN ('completed', 'failed', 'cancelled')
        ORDER BY finished_at LIMIT n
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs j USING old WHERE j.id = old.id RETURNING j.result_ref, j.finished_at
    )
    SELECT count(*), array_agg(gone.result_ref) FILTER (WHERE gone.result_ref IS NOT NULL),
           max(gone.finished_at)
    INTO jobs_deleted, refs_of_jobs, last_taken FROM gone;
    jobs_from := CASE WHEN jobs_deleted < n THEN now() - policy.keep_jobs ELSE last_taken END;

    WITH old AS (
        SELECT id, result_ref, finished_at FROM jobs
        WHERE finished_at < now() - policy.keep_results
          AND finished_at >= coalesce(p_results_from, '-infinity')
          AND result IS NOT NULL AND result_expired_at IS NULL
          AND status IN ('completed', 'failed', 'cancelled')
        ORDER BY finished_at LIMIT n
        FOR UPDATE SKIP LOCKED
    ), dropped AS (
        UPDATE jobs j SET result = NULL, result_ref = NULL, result_expired_at = now()
        FROM old WHERE j.id = old.id RETURNING old.result_ref, old.finished_at
    )
    SELECT count(*), array_agg(dropped.result_ref) FILTER (WHERE dropped.result_ref IS NOT NULL),
           max(dropped.finished_at)
    INTO results_dropped, refs_of_results, last_taken FROM dropped;
    results_from := CASE WHEN results_dropped < n THEN now() - policy.keep_results
                         ELSE last_taken END;

    WITH old AS (
        SELECT e.job_id, e.id, j.finished_at FROM jobs j JOIN job_events e ON e.job_id = j.id
        WHERE j.finished_at < now() - policy.keep_events
          AND j.finished_at >= coalesce(p_events_from, '-infinity')
          AND j.status IN ('completed', 'failed', 'cancelled')
        ORDER BY j.finished_at LIMIT n
    ), gone AS (
        DELETE FROM job_events e USING old WHERE e.job_id = old.job_id AND e.id = old.id
        RETURNING old.finished_at
    )
    SELECT count(*), max(gone.finished_at) INTO events_deleted, last_taken FROM gone;
    events_from := CASE WHEN events_deleted < n THEN now() - policy.keep_events ELSE last_taken END;
    dropped_refs := coalesce(refs_of_jobs, '{}') || coalesce(refs_of_results, '{}');
    RETURN NEXT;
END $$;
REVOKE ALL ON FUNCTION purge_finished_jobs(integer, timestamptz, timestamptz, timestamptz)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION purge_finished_jobs(integer, timestamptz, timestamptz, timestamptz)
    TO space_worker;

-- The previous release's sweeper, during a rolling deploy: every step from the first.
CREATE FUNCTION purge_finished_jobs(batch integer)
RETURNS TABLE (jobs_deleted integer, results_dropped integer, events_deleted integer,
               dropped_refs text[])
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT p.jobs_deleted, p.results_dropped, p.events_deleted, p.dropped_refs
    FROM purge_finished_jobs(batch, NULL, NULL, NULL) AS p
$$;
REVOKE ALL ON FUNCTION purge_finished_jobs(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION purge_finished_jobs(integer) TO space_worker;

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
REVOKE ALL ON FUNCTION result_files_in_use(text[], uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION result_files_in_use(text[], uuid[]) TO space_worker;

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
REVOKE ALL ON FUNCTION results_without_files(text[], timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION results_without_files(text[], timestamptz) TO space_worker;

-- Retention of the audit log past the policy's age, in bounded batches, by the sweeper. As the
-- owner: no application role may delete an entry, and a caller chooses only the batch.
CREATE FUNCTION purge_org_audit(batch integer) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    -- Each organization's oldest entries by its log's key: an entry belongs to an existing
    -- organization (the foreign key cascades), so no entry is out of reach.
    WITH old AS (
        SELECT a.organization_id, a.at, a.id
        FROM organizations o
        CROSS JOIN LATERAL (
            SELECT e.organization_id, e.at, e.id FROM org_audit e
            WHERE e.organization_id = o.id
              AND e.at < now() - (SELECT p.keep_audit FROM retention_policy p)
            ORDER BY e.at, e.id
            LIMIT least(greatest(batch, 0), 10000)
            FOR UPDATE SKIP LOCKED
        ) AS a
        LIMIT least(greatest(batch, 0), 10000)
    ), gone AS (
        DELETE FROM org_audit a USING old
        WHERE a.organization_id = old.organization_id AND a.at = old.at AND a.id = old.id
        RETURNING 1
    )
    SELECT count(*)::integer FROM gone
$$;
REVOKE ALL ON FUNCTION purge_org_audit(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION purge_org_audit(integer) TO space_worker;
