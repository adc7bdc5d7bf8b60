-- Clients see and steer a workflow's steps. job_unmade_steps() gives the web the places and
-- kinds of a parent's children not made yet (a kind's own workflow's steps, a fan-out's items);
-- signal_job() hands a signal sent to a workflow to the job within it that waits for that name,
-- or keeps nothing ('no_step_waits'), and answers which job holds the signal. A waiting job's
-- row keeps the number of the attempt it waits in: wait_job() no longer gives it back, its
-- resume does (jobs_check_transition()).

-- The job trigger: what a transition may do, and what it sets.
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
    IF NEW.organization_id <> OLD.organization_id OR NEW.kind <> OLD.kind
       OR ((NEW.requested_by <> OLD.requested_by OR NEW.params <> OLD.params)
           -- a debounce (submit_job()): a queued job that never started takes the params of
           -- a later submit of its key, and its submitter
           AND NOT (OLD.debounce_seconds IS NOT NULL AND OLD.status = 'queued'
                    AND NEW.status = 'queued' AND OLD.attempts = 0 AND NEW.attempts = 0)) THEN
        RAISE EXCEPTION 'job % snapshot is immutable', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status <> OLD.status AND NOT (
           (OLD.status = 'queued' AND NEW.status IN ('leased', 'cancelled'))
        OR (OLD.status = 'leased' AND NEW.status IN ('completed', 'failed', 'queued', 'cancel_requested',
                                                     'waiting'))
        OR (OLD.status = 'cancel_requested' AND NEW.status IN ('cancelled', 'completed', 'failed'))
        OR (OLD.status = 'waiting' AND NEW.status IN ('queued', 'cancelled', 'failed'))
    ) THEN
        RAISE EXCEPTION 'job % cannot go from % to %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF current_user = 'space_app' AND NOT (
           (OLD.status IN ('queued', 'waiting') AND NEW.status = 'cancelled')
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
    -- What a job waited for ends with the wait, whoever ends it.
    IF OLD.status = 'waiting' AND NEW.status <> 'waiting' THEN
        NEW.wait_until := NULL;
        NEW.wait_signal := NULL;
        NEW.wait_children := NULL;
    END IF;
    -- A waiting job is still in the attempt it waits in (wait_job() keeps its number, so its
    -- row says the attempt it is in, and so does the row of one cancelled while it waits); its
    -- resume, whoever resumes it, gives the attempt back, for the claim that runs it again to
    -- count it once more: a wait never uses one up.
    IF OLD.status = 'waiting' AND NEW.status = 'queued' THEN
        NEW.attempts := greatest(OLD.attempts - 1, 0);
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END $$;

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
CREATE OR REPLACE FUNCTION wait_job(p_id uuid, p_token uuid, p_until timestamptz, p_signal text,
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

-- The places of a parent's children that are not jobs yet, with their kinds: the steps of a
-- kind's own workflow waiting in job_workflow_steps, a fan-out's items not released yet. Never
-- their params (tenant data the lists show nothing of), only a place and a kind. total: how many
-- children the parent's plan holds in all, made or not (NULL: it has no plan, only the children
-- it made, or none). The places after p_after, at most p_limit (1 to 1000) of them, in order. A
-- parent of the scoped organization only (app_org()): nothing of any other.
CREATE FUNCTION job_unmade_steps(p_parent uuid, p_after integer, p_limit integer)
RETURNS TABLE (total integer, places integer[], kinds text[])
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    WITH parent AS (
        SELECT j.id FROM jobs j WHERE j.id = p_parent AND j.organization_id = app_org()
    ), unmade AS (
        SELECT s.place, s.kind
        FROM parent JOIN job_workflow_steps s ON s.parent_id = parent.id
        WHERE s.place > p_after
        UNION ALL
        SELECT i.place, f.kind
        FROM parent JOIN job_fan_outs f ON f.parent_id = parent.id
        JOIN job_fan_out_items i ON i.parent_id = f.parent_id
        WHERE i.place > p_after
        ORDER BY 1
        LIMIT least(greatest(p_limit, 1), 1000)
    )
    SELECT (SELECT coalesce(w.total, f.total) FROM parent
            LEFT JOIN job_workflows w ON w.parent_id = parent.id
            LEFT JOIN job_fan_outs f ON f.parent_id = parent.id),
           coalesce((SELECT array_agg(u.place ORDER BY u.place) FROM unmade u), '{}'),
           coalesce((SELECT array_agg(u.kind ORDER BY u.place) FROM unmade u), '{}')
$$;
REVOKE ALL ON FUNCTION job_unmade_steps(uuid, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION job_unmade_steps(uuid, integer, integer) TO space_app;

DROP FUNCTION signal_job(uuid, text, jsonb, uuid, jsonb);

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
