-- Revision 0054: retention and the metrics fold read no purged history (issue 32).
--
-- Behind a transaction left open, purge_finished_jobs() read jobs_finished_idx from its
-- beginning in each of its three steps, through the entry of every job it had purged since the
-- transaction began, and fold_metric_events() read metric_events from its first id through every
-- event folded since; both run every 5 s (retention up to ten batches a run). Each step now
-- starts from a horizon its caller passes back (the policy's cutoff once a step caught up, else
-- the finish time of the last job it took; the last event id folded), and the sweeper starts
-- from the first row every 60th run. The one-argument functions stay for the previous release's
-- beat, now wrappers.

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
CREATE OR REPLACE FUNCTION purge_finished_jobs(batch integer)
RETURNS TABLE (jobs_deleted integer, results_dropped integer, events_deleted integer,
               dropped_refs text[])
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT p.jobs_deleted, p.results_dropped, p.events_deleted, p.dropped_refs
    FROM purge_finished_jobs(batch, NULL, NULL, NULL) AS p
$$;
REVOKE ALL ON FUNCTION purge_finished_jobs(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION purge_finished_jobs(integer) TO space_worker;

CREATE FUNCTION fold_metric_events(batch integer, p_after bigint)
RETURNS TABLE (folded integer, last_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
-- The events by their key, from p_after on, whatever the statistics say: a sequential scan (or
-- a hash join with one) reads every event a long-open transaction keeps.
SET enable_seqscan = off SET enable_bitmapscan = off AS $$
BEGIN
    RETURN QUERY
    WITH picked AS (
        SELECT e.id FROM metric_events e WHERE e.id > coalesce(p_after, 0)
        ORDER BY e.id LIMIT batch FOR UPDATE SKIP LOCKED
    ), taken AS (
        DELETE FROM metric_events m WHERE m.id = ANY (ARRAY(SELECT p.id FROM picked p))
        RETURNING m.id, m.name, m.kind, m.label, m.value
    ), summed AS (
        SELECT t.name, t.kind, t.label, sum(t.value) AS value FROM taken t
        GROUP BY t.name, t.kind, t.label
    ), upserted AS (
        INSERT INTO metric_counters (name, kind, label, value)
        SELECT s.name, s.kind, s.label, s.value FROM summed s
        ON CONFLICT (name, kind, label) DO UPDATE SET value = metric_counters.value + excluded.value
        RETURNING 1
    )
    -- A data-modifying CTE runs to completion whether or not it is read.
    SELECT count(*)::integer, coalesce(max(t.id), p_after) FROM taken t;
END $$;
REVOKE ALL ON FUNCTION fold_metric_events(integer, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fold_metric_events(integer, bigint) TO space_worker;

-- The previous release's sweeper, during a rolling deploy: from the first event.
CREATE OR REPLACE FUNCTION fold_metric_events(batch integer) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT f.folded FROM fold_metric_events(batch, NULL) AS f
$$;
REVOKE ALL ON FUNCTION fold_metric_events(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fold_metric_events(integer) TO space_worker;
