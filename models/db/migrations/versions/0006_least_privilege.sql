-- Least privilege, revision 0006: each role may do what our code does with it, and nothing
-- more, enforced by the database (column grants, policies, the transition trigger), so that a
-- leaked or misused connection cannot forge a job, read another tenant's result or erase
-- history.

-- ---------------------------------------------------------------------------------------------
-- The claim as a function: it hands the claimed rows' params to the worker, which may otherwise
-- not read params at all (nor results): a worker learns a job's parameters only for the jobs it
-- leases. The statement is the claim_batch of 0004, unchanged in what it does.
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION claim_jobs(p_worker text, p_limit integer, p_skip_kinds text[], p_only_kind text)
RETURNS TABLE (id uuid, organization_id uuid, requested_by uuid, kind text, params jsonb,
               attempts integer, max_attempts integer, lease_token uuid, lease_seconds integer,
               request_id text, more_due boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    RETURN QUERY
    WITH expired AS (
        SELECT e.id FROM jobs e
        WHERE e.status = 'leased' AND e.lease_until < now() AND e.attempts < e.max_attempts
          AND e.kind <> ALL (p_skip_kinds) AND (p_only_kind IS NULL OR e.kind = p_only_kind)
        ORDER BY e.lease_until
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), queued AS (
        SELECT q.id FROM jobs q
        WHERE q.status = 'queued' AND q.run_after <= now()
          AND q.kind <> ALL (p_skip_kinds) AND (p_only_kind IS NULL OR q.kind = p_only_kind)
        ORDER BY q.run_after, q.created_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), chosen AS (
        SELECT c.id FROM (SELECT x.id FROM expired x UNION ALL SELECT y.id FROM queued y) AS c
        LIMIT p_limit
    )
    UPDATE jobs j
    SET status = 'leased', lease_token = gen_random_uuid(), leased_by = p_worker,
        lease_until = clock_timestamp() + j.lease_seconds * interval '1 second',
        attempts = j.attempts + 1, started_at = coalesce(j.started_at, now())
    WHERE j.id = ANY (ARRAY(SELECT chosen.id FROM chosen))
    RETURNING j.id, j.organization_id, j.requested_by, j.kind, j.params, j.attempts,
              j.max_attempts, j.lease_token, j.lease_seconds, j.request_id,
              -- whether more was due than this claim took (as of its start): the claimer then
              -- tells another process, since wake-ups are coalesced
              (SELECT count(*) > p_limit FROM (
                  SELECT 1 FROM jobs m WHERE m.status = 'queued' AND m.run_after <= now()
                  LIMIT p_limit + 1) AS due);
END $$;
REVOKE ALL ON FUNCTION claim_jobs(text, integer, text[], text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION claim_jobs(text, integer, text[], text) TO space_worker;

-- ---------------------------------------------------------------------------------------------
-- Transitions by role. The web may only ask to cancel (queued -> cancelled, leased ->
-- cancel_requested); everything else a job goes through is the workers' (and the owner's).
-- A job is born queued, at attempt 0, with no lease and no result, whoever inserts it.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION jobs_check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IN ('completed', 'failed', 'cancelled') THEN
        -- Terminal rows stay frozen, with one exception: retention may drop the result.
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
    IF current_user = 'space_app' AND NOT (
           (OLD.status = 'queued' AND NEW.status = 'cancelled')
        OR (OLD.status = 'leased' AND NEW.status = 'cancel_requested')) THEN
        RAISE EXCEPTION 'the web may only cancel a job' USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- A live lease is only replaced once it has expired: fencing in the database itself.
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

CREATE OR REPLACE FUNCTION jobs_after_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    -- Whatever a session of an application role inserts (through our functions, the only way
    -- it can) is checked; the owner's administrative sessions (a restore, test set-ups that
    -- plant finished rows) are not.
    IF session_user IN ('space_app', 'space_worker', 'space_operator') AND EXISTS (
               SELECT 1 FROM new_jobs n
               WHERE n.status <> 'queued' OR n.attempts <> 0 OR n.lease_token IS NOT NULL
                  OR n.lease_until IS NOT NULL OR n.leased_by IS NOT NULL OR n.result IS NOT NULL
                  OR n.result_ref IS NOT NULL OR n.started_at IS NOT NULL
                  OR n.finished_at IS NOT NULL OR n.error_code IS NOT NULL) THEN
        RAISE EXCEPTION 'a job is born queued, at attempt 0, with no lease and no result'
            USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO job_events (job_id, organization_id, from_status, to_status, attempt, actor)
    SELECT n.id, n.organization_id, NULL, n.status, n.attempts,
           coalesce(nullif(current_setting('app.actor', true), ''), 'user:' || n.requested_by)
    FROM new_jobs n;
    IF FOUND THEN
        PERFORM pg_notify('spacejobs_jobs', '');
    END IF;
    RETURN NULL;
END $$;

-- ---------------------------------------------------------------------------------------------
-- Policies: nobody but the owner's functions deletes (retention is purge_finished_jobs()), and
-- job_events is written only by the SECURITY DEFINER triggers.
-- ---------------------------------------------------------------------------------------------
DROP POLICY worker_retention ON jobs;
DROP POLICY worker_retention ON job_events;
DROP POLICY worker_retention ON job_diagnostics;
DROP POLICY worker_write ON job_events;
DROP POLICY tenant_rw ON job_events;
CREATE POLICY tenant_read ON job_events FOR SELECT TO space_app
    USING (organization_id = app_org());

-- ---------------------------------------------------------------------------------------------
-- Grants: column lists where a table holds more than the role needs.
-- ---------------------------------------------------------------------------------------------
REVOKE ALL ON jobs FROM space_app, space_worker;
REVOKE ALL ON job_events FROM space_app, space_worker;
REVOKE ALL ON job_diagnostics FROM space_worker;

-- The web reads its organization's jobs (never the lease token) and may ask to cancel one.
-- It writes jobs only through submit_job()/submit_jobs().
GRANT SELECT (id, organization_id, requested_by, kind, status, params, lease_until, leased_by,
              lease_seconds, attempts, max_attempts, run_after, progress, result, result_ref,
              error_code, error_message, dedup_key, idempotency_key, request_id, last_wakeup_at,
              cancel_requested_by, created_at, updated_at, started_at, finished_at,
              cancel_requested_at, result_expired_at, retry_of)
    ON jobs TO space_app;
GRANT UPDATE (status, cancel_requested_at, cancel_requested_by) ON jobs TO space_app;
GRANT SELECT ON job_events TO space_app;

-- The worker reads the queue's metadata across organizations, never a params or a result
-- (params come from claim_jobs() for the jobs it leases), and moves the jobs it holds.
GRANT SELECT (id, organization_id, requested_by, kind, status, lease_token, lease_until,
              leased_by, lease_seconds, attempts, max_attempts, run_after, progress,
              error_code, error_message, dedup_key, request_id, last_wakeup_at,
              cancel_requested_by, created_at, updated_at, started_at, finished_at,
              cancel_requested_at, result_expired_at, retry_of)
    ON jobs TO space_worker;
GRANT UPDATE (status, lease_token, lease_until, leased_by, attempts, run_after, progress, result,
              error_code, error_message, last_wakeup_at)
    ON jobs TO space_worker;
GRANT SELECT ON job_events TO space_worker;
GRANT INSERT ON job_diagnostics TO space_worker;

-- Trigger functions run as triggers, never called: nobody needs EXECUTE on them.
REVOKE ALL ON FUNCTION jobs_after_insert() FROM PUBLIC;
REVOKE ALL ON FUNCTION jobs_after_update() FROM PUBLIC;
