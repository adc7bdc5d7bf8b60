-- Jobs that wait without holding a worker: a timer, a signal, their children. A waiting job
-- holds no lease; the database itself puts it back in the queue when what it waits for has
-- come (resume_due_timers() for timers, resume_due_waits() for timers and lost resumes,
-- signal_job() for signals, the jobs trigger for children), and the kind runs again from the top, its recorded steps answered from
-- job_steps instead of being run again.

-- What a job's steps returned, recorded in the lease holder's fenced transaction: a later run of
-- the job (after a wait, a crash, a retry) gets the same value back without doing the step again.
CREATE TABLE job_steps (
    job_id          uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    name            text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    organization_id uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    result          jsonb,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name)
);

-- Signals sent to a job (a person's approval, another system's callback), kept until a wait of
-- the job takes them, one each, in the order they came. The payload is tenant data.
CREATE TABLE job_signals (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id          uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    organization_id uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    name            text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$'),
    payload         jsonb NOT NULL,
    sent_by         uuid REFERENCES users (id),
    sent_at         timestamptz NOT NULL DEFAULT now(),
    taken_at        timestamptz
);
CREATE INDEX job_signals_untaken_idx ON job_signals (job_id, name, id) WHERE taken_at IS NULL;

-- The lease holder ends its run to wait: the job gives back its lease and its slot, and the
-- attempt is not used up (the claim that resumes it counts it again). Unless what it waits for
-- has already come (a signal sent meanwhile, a moment passed, fewer children active than the
-- caller saw when it looked, or none): then it is queued again at once. The job's row is locked
-- first, so a signal_job() or a child's end from now on sees the job waiting; a child that
-- ended between the caller's look and this lock is counted here (p_children_seen: how many
-- the caller saw active, NULL when it does not wait for children). Returns the job's new
-- status, or NULL when the caller no longer holds the lease (cancel_requested: the caller
-- acknowledges the cancel).
CREATE FUNCTION wait_job(p_id uuid, p_token uuid, p_until timestamptz, p_signal text,
                         p_children_seen integer)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    found_job jobs;
    active_children integer;
    met boolean;
BEGIN
    SELECT * INTO found_job FROM jobs j
    WHERE j.id = p_id AND j.lease_token = p_token AND j.status = 'leased' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF p_children_seen IS NOT NULL THEN
        SELECT count(*) INTO active_children FROM jobs c
        WHERE c.parent_id = p_id AND c.status IN ('queued', 'leased', 'cancel_requested', 'waiting');
    END IF;
    met := (p_until IS NOT NULL AND p_until <= now())
        OR (p_signal IS NOT NULL AND EXISTS (
                SELECT 1 FROM job_signals s
                WHERE s.job_id = p_id AND s.name = p_signal AND s.taken_at IS NULL))
        OR (p_children_seen IS NOT NULL
            AND (active_children = 0 OR active_children < p_children_seen))
        OR (p_until IS NULL AND p_signal IS NULL AND p_children_seen IS NULL);
    UPDATE jobs j
    SET status = CASE WHEN met THEN 'queued' ELSE 'waiting' END,
        attempts = j.attempts - 1, run_after = now(),
        lease_token = NULL, lease_until = NULL, leased_by = NULL,
        last_wakeup_at = CASE WHEN met THEN NULL ELSE now() END,
        wait_until = CASE WHEN met THEN NULL ELSE p_until END,
        wait_signal = CASE WHEN met THEN NULL ELSE p_signal END,
        wait_children = CASE WHEN met THEN NULL ELSE active_children END
    WHERE j.id = p_id;
    RETURN CASE WHEN met THEN 'queued' ELSE 'waiting' END;
END $$;
REVOKE ALL ON FUNCTION wait_job(uuid, uuid, timestamptz, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION wait_job(uuid, uuid, timestamptz, text, integer) TO space_worker;

-- The sweeper's resumes, bounded per call: waiting jobs whose moment has come (a timer, a
-- signal's timeout), and, as the floor under the trigger, parents with fewer children active
-- than when they began to wait (a child that ended at the very moment they did), but not a
-- parent whose fan-out or workflow the database runs before it is settled (70_fan_out.sql).
-- Returns the resumed jobs, to wake workers for them.
CREATE FUNCTION resume_due_waits(p_batch integer)
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
                         AND c.status IN ('queued', 'leased', 'cancel_requested', 'waiting'))
                   AND NOT EXISTS (SELECT 1 FROM job_fan_outs f
                                   WHERE f.parent_id = j.id AND f.ended < f.total)
                   AND NOT EXISTS (SELECT 1 FROM job_workflows w
                                   WHERE w.parent_id = j.id AND w.ended < w.released
                                     AND NOT (w.policy = 'fail_fast' AND w.failed > 0))))
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

-- Beat's short cadence (SPACEJOBS_TIMER_INTERVAL): the timers alone, waiting jobs whose moment
-- has come. A range of jobs_waiting_idx, so its cost follows the timers that are due, not the
-- jobs waiting for signals or children nor the finished rows (resume_due_waits() reads every
-- waiting job, and counts each waiting parent's children). Returns the resumed jobs, to wake
-- workers for them.
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

-- A member's signal to a job of the scoped organization, by the cancel rule (the requester, or a
-- current member holding the kind's role; p_kind_roles as for request_cancel). It is kept until
-- a wait of the job takes it; a job waiting for that name is queued again at once. Answers
-- 'sent' (and the job's status), 'not_found' (no such job in this organization, or a member who
-- may not see it), 'finished', or 'refused' (a member without the right).
CREATE FUNCTION signal_job(p_id uuid, p_name text, p_payload jsonb, p_user uuid,
                           p_kind_roles jsonb)
RETURNS TABLE (outcome text, status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    found_job jobs;
    member_role text;
BEGIN
    SELECT * INTO found_job FROM jobs j
    WHERE j.id = p_id AND j.organization_id = app_org() FOR UPDATE;
    SELECT m.role INTO member_role FROM memberships m JOIN organizations o ON o.id = m.organization_id
    WHERE m.organization_id = app_org() AND m.user_id = p_user AND o.state <> 'deleted';
    IF found_job.id IS NULL OR member_role IS NULL THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::text;
        RETURN;
    END IF;
    IF found_job.status IN ('completed', 'failed', 'cancelled') THEN
        RETURN QUERY SELECT 'finished'::text, found_job.status;
        RETURN;
    END IF;
    IF found_job.requested_by <> p_user
       AND role_rank(member_role) < role_rank(coalesce(p_kind_roles ->> found_job.kind, 'owner')) THEN
        RETURN QUERY SELECT 'refused'::text, found_job.status;
        RETURN;
    END IF;
    INSERT INTO job_signals (job_id, organization_id, name, payload, sent_by)
    VALUES (p_id, found_job.organization_id, p_name, p_payload, p_user);
    IF found_job.status = 'waiting' AND found_job.wait_signal = p_name THEN
        UPDATE jobs j SET status = 'queued', run_after = now(), last_wakeup_at = NULL
        WHERE j.id = p_id;
        PERFORM pg_notify('spacejobs_jobs', '');
        RETURN QUERY SELECT 'sent'::text, 'queued'::text;
        RETURN;
    END IF;
    RETURN QUERY SELECT 'sent'::text, found_job.status;
END $$;
REVOKE ALL ON FUNCTION signal_job(uuid, text, jsonb, uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION signal_job(uuid, text, jsonb, uuid, jsonb) TO space_app;

-- job_steps and job_signals: the worker reads and writes them for the jobs it holds (in
-- transactions scoped to the job's organization, fenced by lock_lease like every write of a
-- job's run); the web reads a job's steps; signals reach the table only through signal_job().
ALTER TABLE job_steps ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_steps FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_steps TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY worker_rw ON job_steps TO space_worker
    USING (organization_id = app_org()) WITH CHECK (organization_id = app_org());
CREATE POLICY tenant_read ON job_steps FOR SELECT TO space_app
    USING (organization_id = app_org());

ALTER TABLE job_signals ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_signals FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_signals TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY worker_take ON job_signals TO space_worker
    USING (organization_id = app_org()) WITH CHECK (organization_id = app_org());

GRANT SELECT, INSERT ON job_steps TO space_worker;
GRANT SELECT (job_id, name, recorded_at) ON job_steps TO space_app;
GRANT SELECT (id, job_id, organization_id, name, payload, taken_at) ON job_signals TO space_worker;
GRANT UPDATE (taken_at) ON job_signals TO space_worker;
