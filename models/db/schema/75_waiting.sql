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
    taken_at        timestamptz,
    -- the sender's role in the organization when they sent it (take_signal() hands it to the
    -- kind with the sender, so an approval can require a role)
    sender_role     text CHECK (sender_role IN ('owner', 'admin', 'member'))
);
CREATE INDEX job_signals_untaken_idx ON job_signals (job_id, name, id) WHERE taken_at IS NULL;

-- The lease holder ends its run to wait: the job gives back its lease and its slot, and the
-- attempt is not used up: the row keeps the attempt's number while it waits, and its resume
-- gives it back (jobs_check_transition()), for the claim that runs it again to count it once
-- more. Unless what it waits for has already come (a signal sent meanwhile, a moment passed,
-- fewer children active than the caller saw when it looked, or none): then it is queued again
-- at once, its attempt given back here. The job's row is locked
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
        attempts = CASE WHEN met THEN j.attempts - 1 ELSE j.attempts END, run_after = now(),
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

-- A member's signal to a job of the scoped organization, by the cancel rule: the requester, or
-- a current member holding the role the job needs (job_role_needed(): for a parent, the
-- strictest of what it holds; p_kind_roles as for request_cancel), in an organization that is
-- not deleted (a read-only one takes signals as it takes cancels: the kind's own rules decide at
-- its next run whether it may go on). It is kept, with who sent it and their role, until a wait
-- of the job takes it; a job waiting for that name is queued again at once. A workflow never
-- waits for a signal itself: one sent to it goes to the job within it (a step, or a step's own
-- child) that waits for that name now, the first by place, under the workflow's rule; when none
-- does, nothing is kept ('no_step_waits'). Bounded: a payload of at most 64 KiB (as JSON text),
-- and at most 10 signals a job has not taken yet.
-- Answers 'sent' (with the status and the id of the job that holds the signal), 'not_found' (no
-- such job in this organization, or a member who may not see it), 'finished', 'refused' (a
-- member without the right), 'too_large', 'too_many' or 'no_step_waits' (nothing kept).
CREATE FUNCTION signal_job(p_id uuid, p_name text, p_payload jsonb, p_user uuid,
                           p_kind_roles jsonb)
RETURNS TABLE (outcome text, status text, receiver uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    max_payload CONSTANT integer := 65536;
    max_pending CONSTANT integer := 10;
    found_job jobs;
    taker jobs;
    member_role text;
BEGIN
    IF EXISTS (SELECT 1 FROM jobs j WHERE j.id = p_id AND j.organization_id = app_org()
                                      AND j.kind = 'workflow') THEN
        -- The waiting job within the workflow, locked before the workflow's row: a child's row
        -- before its parent's, in the order a cancel and a child's finish take them.
        WITH RECURSIVE tree AS (
            SELECT c.id, ARRAY[c.child_index] AS path FROM jobs c WHERE c.parent_id = p_id
            UNION ALL
            SELECT c.id, t.path || c.child_index FROM tree t JOIN jobs c ON c.parent_id = t.id
        )
        SELECT j.* INTO taker FROM tree t JOIN jobs j ON j.id = t.id
        WHERE j.status = 'waiting' AND j.wait_signal = p_name
        ORDER BY t.path
        LIMIT 1
        FOR UPDATE OF j;
    END IF;
    SELECT * INTO found_job FROM jobs j
    WHERE j.id = p_id AND j.organization_id = app_org() FOR UPDATE;
    SELECT m.role INTO member_role FROM memberships m JOIN organizations o ON o.id = m.organization_id
    WHERE m.organization_id = app_org() AND m.user_id = p_user AND o.state <> 'deleted';
    IF found_job.id IS NULL OR member_role IS NULL THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::text, NULL::uuid;
        RETURN;
    END IF;
    IF found_job.status IN ('completed', 'failed', 'cancelled') THEN
        RETURN QUERY SELECT 'finished'::text, found_job.status, NULL::uuid;
        RETURN;
    END IF;
    IF found_job.requested_by <> p_user
       AND role_rank(member_role) < coalesce(role_rank(job_role_needed(p_id, p_kind_roles)), 4) THEN
        RETURN QUERY SELECT 'refused'::text, found_job.status, NULL::uuid;
        RETURN;
    END IF;
    IF octet_length(p_payload::text) > max_payload THEN
        RETURN QUERY SELECT 'too_large'::text, found_job.status, NULL::uuid;
        RETURN;
    END IF;
    IF found_job.kind <> 'workflow' THEN
        taker := found_job;
    ELSIF taker.id IS NULL THEN
        RETURN QUERY SELECT 'no_step_waits'::text, found_job.status, NULL::uuid;
        RETURN;
    END IF;
    -- The taker's row is locked above: signals of one job are counted one sender at a time.
    IF (SELECT count(*) FROM job_signals s WHERE s.job_id = taker.id AND s.taken_at IS NULL)
       >= max_pending THEN
        RETURN QUERY SELECT 'too_many'::text, taker.status, NULL::uuid;
        RETURN;
    END IF;
    INSERT INTO job_signals (job_id, organization_id, name, payload, sent_by, sender_role)
    VALUES (taker.id, taker.organization_id, p_name, p_payload, p_user, member_role);
    IF taker.status = 'waiting' AND taker.wait_signal = p_name THEN
        UPDATE jobs j SET status = 'queued', run_after = now(), last_wakeup_at = NULL
        WHERE j.id = taker.id;
        PERFORM pg_notify('spacejobs_jobs', '');
        RETURN QUERY SELECT 'sent'::text, 'queued'::text, taker.id;
        RETURN;
    END IF;
    RETURN QUERY SELECT 'sent'::text, taker.status, taker.id;
END $$;
REVOKE ALL ON FUNCTION signal_job(uuid, text, jsonb, uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION signal_job(uuid, text, jsonb, uuid, jsonb) TO space_app;

-- job_steps and job_signals: the worker reaches them only through the functions below, each
-- for a job whose lease token it presents; the web reads a job's steps' names; signals reach
-- the table only through signal_job().
ALTER TABLE job_steps ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_steps FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_steps TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY tenant_read ON job_steps FOR SELECT TO space_app
    USING (organization_id = app_org());

ALTER TABLE job_signals ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_signals FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_signals TO space_owner USING (true) WITH CHECK (true);

GRANT SELECT (job_id, name, recorded_at) ON job_steps TO space_app;

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
