-- Without the token, nothing: the worker role changes a job, and reaches a job's steps, signals
-- and diagnostics, only through functions that take the job's lease token; it reads no lease
-- token and has no UPDATE on jobs; its row-level security on tenant tables admits only the
-- organization of a lease the transaction presents (lease_org()). A taken signal tells the kind
-- who sent it, and the role they held. The stale finishes are counted by the database under its
-- own kinds, and count_event() takes no label.

ALTER TABLE job_signals ADD COLUMN sender_role text
    CHECK (sender_role IN ('owner', 'admin', 'member'));

-- The organization of the lease the current transaction presents: app.job_id and
-- app.lease_token, set by the worker's scope of a job it runs (models/db/transaction.py), while
-- that token holds the lease; NULL otherwise. The worker's policies on tenant tables compare
-- with it, as (SELECT lease_org()): one evaluation a statement, not one a row.
CREATE FUNCTION lease_org() RETURNS uuid
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    RETURN (SELECT j.organization_id FROM jobs j
            WHERE j.id = nullif(current_setting('app.job_id', true), '')::uuid
              AND j.lease_token = nullif(current_setting('app.lease_token', true), '')::uuid
              AND j.status IN ('leased', 'cancel_requested'));
END $$;
REVOKE ALL ON FUNCTION lease_org() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lease_org() TO space_worker;

-- The worker's tenant data: that of the organization whose lease it presents, nothing else.
ALTER POLICY tenant_read ON organizations TO space_app;
ALTER POLICY tenant_read ON memberships TO space_app;
ALTER POLICY tenant_rw ON projects TO space_app;
CREATE POLICY worker_lease_read ON organizations FOR SELECT TO space_worker
    USING (id = (SELECT lease_org()));
CREATE POLICY worker_lease_read ON memberships FOR SELECT TO space_worker
    USING (organization_id = (SELECT lease_org()));
CREATE POLICY worker_lease_rw ON projects TO space_worker
    USING (organization_id = (SELECT lease_org()))
    WITH CHECK (organization_id = (SELECT lease_org()));

-- The job's status while the caller's token holds its lease; NULL otherwise.
CREATE FUNCTION lease_status(p_id uuid, p_token uuid) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    RETURN (SELECT j.status FROM jobs j
            WHERE j.id = p_id AND j.lease_token = p_token
              AND j.status IN ('leased', 'cancel_requested'));
END $$;
REVOKE ALL ON FUNCTION lease_status(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lease_status(uuid, uuid) TO space_worker;

-- Taken at the end of every tenant transaction of a job: its writes commit only while the
-- attempt still holds the lease, and nobody can re-claim the row until that commit. False when
-- the token no longer holds it.
CREATE FUNCTION lock_lease(p_id uuid, p_token uuid) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    PERFORM 1 FROM jobs j
    WHERE j.id = p_id AND j.lease_token = p_token AND j.status IN ('leased', 'cancel_requested')
    FOR UPDATE;
    RETURN FOUND;
END $$;
REVOKE ALL ON FUNCTION lock_lease(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_lease(uuid, uuid) TO space_worker;

-- Heartbeat, one statement for every lease a worker process holds. A job missing from the
-- answer is no longer the caller's (expired and taken, or ended); its status says whether a
-- cancel was asked for.
CREATE FUNCTION extend_leases(p_ids uuid[], p_tokens uuid[])
RETURNS TABLE (id uuid, status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    RETURN QUERY
    UPDATE jobs j
    SET lease_until = clock_timestamp() + j.lease_seconds * interval '1 second'
    FROM unnest(p_ids, p_tokens) AS held (job_id, token)
    WHERE j.id = ANY (p_ids) AND j.id = held.job_id AND j.lease_token = held.token
      AND j.status IN ('leased', 'cancel_requested')
    RETURNING j.id, j.status;
END $$;
REVOKE ALL ON FUNCTION extend_leases(uuid[], uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION extend_leases(uuid[], uuid[]) TO space_worker;

-- Measured progress of a held job; the job's status, or NULL when the lease is not the caller's.
CREATE FUNCTION record_progress(p_id uuid, p_token uuid, p_progress jsonb) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    found_status text;
BEGIN
    UPDATE jobs j SET progress = p_progress
    WHERE j.id = p_id AND j.lease_token = p_token AND j.status IN ('leased', 'cancel_requested')
    RETURNING j.status INTO found_status;
    RETURN found_status;
END $$;
REVOKE ALL ON FUNCTION record_progress(uuid, uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION record_progress(uuid, uuid, jsonb) TO space_worker;

-- The fenced finish of many jobs in one statement: a job is completed only while the caller's
-- token still holds its lease; one whose token moved on (a newer attempt owns it) is left alone
-- and missing from the answer, and counted as a stale finish under its kind (the database's
-- own kinds: a caller cannot add labels). A cancel that arrived too late loses to a finished
-- job (cancel_requested -> completed). A large result's file is already in the results store;
-- p_refs names it (and the result describes it).
CREATE FUNCTION complete_jobs(p_ids uuid[], p_tokens uuid[], p_results jsonb[], p_refs text[])
RETURNS TABLE (id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    completed uuid[];
BEGIN
    WITH done AS (
        UPDATE jobs j
        SET status = 'completed', result = d.result, result_ref = d.ref, error_code = NULL,
            error_message = NULL, leased_by = NULL
        FROM unnest(p_ids, p_tokens, p_results, p_refs) AS d (job_id, token, result, ref)
        WHERE j.id = ANY (p_ids) AND j.id = d.job_id AND j.lease_token = d.token
          AND j.status IN ('leased', 'cancel_requested')
        RETURNING j.id
    )
    SELECT coalesce(array_agg(done.id), '{}') INTO completed FROM done;
    IF cardinality(completed) < cardinality(p_ids) THEN
        INSERT INTO metric_events (name, kind, label, value)
        SELECT 'spacejobs_stale_finishes_fenced_total', s.kind, '', count(*)
        FROM jobs s WHERE s.id = ANY (p_ids) AND s.id <> ALL (completed)
        GROUP BY s.kind;
    END IF;
    RETURN QUERY SELECT unnest(completed);
END $$;
REVOKE ALL ON FUNCTION complete_jobs(uuid[], uuid[], jsonb[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION complete_jobs(uuid[], uuid[], jsonb[], text[]) TO space_worker;

-- One decision for every failed attempt, fenced like the finish: a requested cancel wins, a
-- permanent error or the last attempt fails the job, anything else goes back to the queue with
-- run_after pushed out by the caller's backoff (at most a day). An unexpected exception's
-- diagnosis (its classes and frames, never a message: models/diagnostics.py) is kept for
-- operators in the same transaction, for the attempt that failed. No row when the lease is not
-- the caller's.
CREATE FUNCTION fail_job(p_id uuid, p_token uuid, p_permanent boolean, p_retry_in double precision,
                         p_error_code text, p_error_message text, p_worker text DEFAULT NULL,
                         p_exception_class text DEFAULT NULL, p_traceback text DEFAULT NULL)
RETURNS TABLE (status text, run_after timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    failed jobs;
BEGIN
    UPDATE jobs j
    SET status = CASE
            WHEN j.status = 'cancel_requested' THEN 'cancelled'
            WHEN p_permanent OR j.attempts >= j.max_attempts THEN 'failed'
            ELSE 'queued' END,
        run_after = CASE
            WHEN j.status = 'leased' AND NOT p_permanent AND j.attempts < j.max_attempts
            THEN clock_timestamp() + least(greatest(p_retry_in, 0), 86400) * interval '1 second'
            ELSE j.run_after END,
        error_code = p_error_code, error_message = p_error_message,
        lease_token = NULL, lease_until = NULL, leased_by = NULL, last_wakeup_at = NULL
    WHERE j.id = p_id AND j.lease_token = p_token AND j.status IN ('leased', 'cancel_requested')
    RETURNING j.* INTO failed;
    IF failed.id IS NULL THEN
        RETURN;
    END IF;
    IF p_exception_class IS NOT NULL THEN
        INSERT INTO job_diagnostics (job_id, organization_id, attempt, worker, exception_class,
                                     traceback)
        VALUES (failed.id, failed.organization_id, failed.attempts, p_worker,
                left(p_exception_class, 1000), left(coalesce(p_traceback, ''), 100000));
    END IF;
    RETURN QUERY SELECT failed.status, failed.run_after;
END $$;
REVOKE ALL ON FUNCTION fail_job(uuid, uuid, boolean, double precision, text, text, text, text, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fail_job(uuid, uuid, boolean, double precision, text, text, text, text,
                                   text)
    TO space_worker;

-- The running job saw cancel_requested at a safe point and stops. False when the lease is not
-- the caller's (or no cancel was asked for).
CREATE FUNCTION acknowledge_cancel(p_id uuid, p_token uuid) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    UPDATE jobs j
    SET status = 'cancelled', lease_token = NULL, lease_until = NULL, leased_by = NULL
    WHERE j.id = p_id AND j.lease_token = p_token AND j.status = 'cancel_requested';
    RETURN FOUND;
END $$;
REVOKE ALL ON FUNCTION acknowledge_cancel(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION acknowledge_cancel(uuid, uuid) TO space_worker;

-- Graceful shutdown: give held jobs back untouched, the attempt not burned, claimable at once.
CREATE FUNCTION release_jobs(p_ids uuid[], p_tokens uuid[]) RETURNS TABLE (id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    RETURN QUERY
    UPDATE jobs j
    SET status = 'queued', attempts = j.attempts - 1, run_after = now(),
        lease_token = NULL, lease_until = NULL, leased_by = NULL, last_wakeup_at = NULL
    FROM unnest(p_ids, p_tokens) AS held (job_id, token)
    WHERE j.id = ANY (p_ids) AND j.id = held.job_id AND j.lease_token = held.token
      AND j.status = 'leased'
    RETURNING j.id;
END $$;
REVOKE ALL ON FUNCTION release_jobs(uuid[], uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION release_jobs(uuid[], uuid[]) TO space_worker;

-- The sweeper, bounded per call: leases that ran out go back to the queue (attempts left),
-- fail (none left: lease_expired) or end cancelled (a cancel was asked for). Several sweepers on
-- several hosts take disjoint batches (SKIP LOCKED). What a caller can do through it is what
-- the sweeper does anyway: nothing to a job whose lease still runs.
CREATE FUNCTION sweep_expired_leases(p_batch integer) RETURNS TABLE (id uuid, status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    RETURN QUERY
    WITH expired AS (
        SELECT e.id FROM jobs e
        WHERE e.status IN ('leased', 'cancel_requested') AND e.lease_until < now()
        ORDER BY e.lease_until
        LIMIT least(greatest(p_batch, 1), 10000)
        FOR UPDATE SKIP LOCKED
    )
    UPDATE jobs j
    SET status = CASE
            WHEN j.status = 'cancel_requested' THEN 'cancelled'
            WHEN j.attempts >= j.max_attempts THEN 'failed'
            ELSE 'queued' END,
        error_code = CASE
            WHEN j.status = 'leased' AND j.attempts >= j.max_attempts THEN 'lease_expired'
            ELSE j.error_code END,
        error_message = CASE
            WHEN j.status = 'leased' AND j.attempts >= j.max_attempts
            THEN 'The job stopped responding and has no attempts left.'
            ELSE j.error_message END,
        run_after = now(), lease_token = NULL, lease_until = NULL, leased_by = NULL,
        last_wakeup_at = NULL
    FROM expired WHERE j.id = expired.id
    RETURNING j.id, j.status;
END $$;
REVOKE ALL ON FUNCTION sweep_expired_leases(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sweep_expired_leases(integer) TO space_worker;

-- Due jobs that nobody claimed within p_grace seconds get a fresh wake-up: this is what makes a
-- lost Redis message cost latency, never a job. Marking last_wakeup_at first keeps several
-- sweepers from re-sending the same wake-up. A job put back in the queue (retry, expired lease,
-- release at shutdown) has last_wakeup_at cleared, so it is signalled as soon as it is due; a
-- new job (last_wakeup_at = its submit) first gets the grace period for the web's own wake-up.
-- Bounded per call; it changes nothing but the mark.
CREATE FUNCTION sweep_unsignalled(p_grace double precision, p_batch integer)
RETURNS TABLE (id uuid, kind text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    RETURN QUERY
    WITH due AS (
        SELECT d.id FROM jobs d
        WHERE d.status = 'queued' AND d.run_after <= now()
          AND (d.last_wakeup_at IS NULL
               OR d.last_wakeup_at <= now() - greatest(p_grace, 0) * interval '1 second')
        ORDER BY d.run_after, d.created_at
        LIMIT least(greatest(p_batch, 1), 10000)
        FOR UPDATE SKIP LOCKED
    )
    UPDATE jobs j SET last_wakeup_at = now()
    FROM due WHERE j.id = due.id
    RETURNING j.id, j.kind;
END $$;
REVOKE ALL ON FUNCTION sweep_unsignalled(double precision, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sweep_unsignalled(double precision, integer) TO space_worker;

-- A step the held job recorded earlier: held is false when the token does not hold the job's
-- lease (the caller stops: it is no longer the job's runner); found says whether the step was
-- recorded, and result is what it returned.
CREATE FUNCTION step_result(p_id uuid, p_token uuid, p_name text)
RETURNS TABLE (held boolean, found boolean, result jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF lease_status(p_id, p_token) IS NULL THEN
        RETURN QUERY SELECT false, false, NULL::jsonb;
        RETURN;
    END IF;
    RETURN QUERY SELECT true, s.job_id IS NOT NULL, s.result
                 FROM (SELECT 1) AS one
                 LEFT JOIN job_steps s ON s.job_id = p_id AND s.name = p_name;
END $$;
REVOKE ALL ON FUNCTION step_result(uuid, uuid, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION step_result(uuid, uuid, text) TO space_worker;

-- What a step of the held job returned, recorded under its name in the lease holder's fenced
-- transaction (the job's row stays locked until it commits): the first record of a name stays.
-- False, and nothing written, when the token does not hold the lease.
CREATE FUNCTION record_step(p_id uuid, p_token uuid, p_name text, p_result jsonb) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    holder jobs;
BEGIN
    SELECT * INTO holder FROM jobs j
    WHERE j.id = p_id AND j.lease_token = p_token AND j.status IN ('leased', 'cancel_requested')
    FOR UPDATE;
    IF holder.id IS NULL THEN
        RETURN false;
    END IF;
    INSERT INTO job_steps (job_id, name, organization_id, result)
    VALUES (p_id, p_name, holder.organization_id, p_result)
    ON CONFLICT (job_id, name) DO NOTHING;
    RETURN true;
END $$;
REVOKE ALL ON FUNCTION record_step(uuid, uuid, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION record_step(uuid, uuid, text, jsonb) TO space_worker;

-- A wait of the held job takes the oldest signal of that name not taken yet, and records it as
-- the step p_step in the same fenced transaction, so a later run finds the step and no other
-- wait takes it. What is recorded, and returned, is the payload with who sent it and the role
-- they held then ({"_taken_signal": {...}}: the kind trusts the sender the database names, never
-- a field of the payload). The signal's own row keeps who and when, not the payload again.
-- held is false when the token does not hold the lease; taken is false when no signal waits.
CREATE FUNCTION take_signal(p_id uuid, p_token uuid, p_name text, p_step text)
RETURNS TABLE (held boolean, taken boolean, recorded jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    holder jobs;
    oldest job_signals;
    envelope jsonb;
BEGIN
    SELECT * INTO holder FROM jobs j
    WHERE j.id = p_id AND j.lease_token = p_token AND j.status IN ('leased', 'cancel_requested')
    FOR UPDATE;
    IF holder.id IS NULL THEN
        RETURN QUERY SELECT false, false, NULL::jsonb;
        RETURN;
    END IF;
    SELECT * INTO oldest FROM job_signals s
    WHERE s.job_id = p_id AND s.name = p_name AND s.taken_at IS NULL
    ORDER BY s.id LIMIT 1
    FOR UPDATE;
    IF oldest.id IS NULL THEN
        RETURN QUERY SELECT true, false, NULL::jsonb;
        RETURN;
    END IF;
    envelope := jsonb_build_object('_taken_signal', jsonb_build_object(
        'payload', oldest.payload, 'sent_by', oldest.sent_by, 'sender_role', oldest.sender_role,
        'sent_at', oldest.sent_at));
    UPDATE job_signals s SET taken_at = now(), payload = 'null'::jsonb WHERE s.id = oldest.id;
    INSERT INTO job_steps (job_id, name, organization_id, result)
    VALUES (p_id, p_step, holder.organization_id, envelope)
    ON CONFLICT (job_id, name) DO NOTHING;
    RETURN QUERY SELECT true, true, envelope;
END $$;
REVOKE ALL ON FUNCTION take_signal(uuid, uuid, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION take_signal(uuid, uuid, text, text) TO space_worker;

-- What the worker role no longer has: UPDATE on jobs (every column), the lease tokens, and the
-- tables of steps, signals and diagnostics.
DROP POLICY worker_queue_update ON jobs;
REVOKE UPDATE ON jobs FROM space_worker;
REVOKE SELECT (lease_token) ON jobs FROM space_worker;
DROP POLICY worker_write ON job_diagnostics;
REVOKE INSERT ON job_diagnostics FROM space_worker;
DROP POLICY worker_rw ON job_steps;
REVOKE ALL ON job_steps FROM space_worker;
DROP POLICY worker_take ON job_signals;
REVOKE ALL ON job_signals FROM space_worker;

-- Counters bumped from Python (wake-ups published or failed) go through this one narrow door:
-- two names, a positive finite amount (a flush's sum), and no label. A caller cannot make a
-- counter go down (every rate() would read a reset), poison it with NaN or Infinity, or add a
-- series: the only labels any counter has are what the database itself knows (the kinds of its
-- jobs; the stale finishes are counted by complete_jobs(), which sees them). p_kind stays in
-- the signature for the callers of the previous release, and must be ''.
CREATE OR REPLACE FUNCTION count_event(p_name text, p_kind text, p_by double precision)
RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT bump_metric(p_name, '', '', p_by)
    WHERE p_name IN ('spacejobs_wakeups_published_total', 'spacejobs_wakeups_failed_total')
      AND p_by > 0 AND p_by <= 1e9 AND p_kind = ''
$$;
REVOKE ALL ON FUNCTION count_event(text, text, double precision) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION count_event(text, text, double precision) TO space_app, space_worker;

