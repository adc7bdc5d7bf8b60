-- Retention, revision 0002. Finished jobs, their events and their results are deleted by age,
-- in bounded batches, by the sweeper. The purge runs as the owner (SECURITY DEFINER) because
-- it must see every organization's events, which the worker role may not read; only the
-- worker role may call it, and it touches nothing that is not finished.

ALTER TABLE jobs ADD COLUMN result_expired_at timestamptz;

-- Terminal rows stay frozen, with one exception: retention may drop the result.
CREATE OR REPLACE FUNCTION jobs_check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IN ('completed', 'failed', 'cancelled') THEN
        IF NEW.result_expired_at IS NOT NULL AND OLD.result_expired_at IS NULL
           AND NEW.result IS NULL AND NEW.result_ref IS NULL THEN
            NEW := OLD;
            NEW.result := NULL;
            NEW.result_ref := NULL;
            NEW.result_expired_at := now();
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'job % is % and can no longer change', OLD.id, OLD.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.organization_id <> OLD.organization_id OR NEW.requested_by <> OLD.requested_by
       OR NEW.kind <> OLD.kind OR NEW.params <> OLD.params THEN
        RAISE EXCEPTION 'job % snapshot is immutable', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status <> OLD.status AND NOT (
           (OLD.status = 'queued' AND NEW.status IN ('leased', 'cancelled'))
        OR (OLD.status = 'leased' AND NEW.status IN ('completed', 'failed', 'queued', 'cancel_requested'))
        OR (OLD.status = 'cancel_requested' AND NEW.status IN ('cancelled', 'completed', 'failed'))
    ) THEN
        RAISE EXCEPTION 'job % cannot go from % to %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.status = 'leased' AND NEW.status = 'leased'
       AND NEW.lease_token IS DISTINCT FROM OLD.lease_token AND OLD.lease_until > now() THEN
        RAISE EXCEPTION 'job % is leased until %', OLD.id, OLD.lease_until
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status IN ('completed', 'failed', 'cancelled') THEN
        NEW.finished_at := coalesce(NEW.finished_at, now());
        NEW.lease_token := NULL;
        NEW.lease_until := NULL;
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END $$;

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
GRANT SELECT (result_expired_at) ON jobs TO space_operator;
