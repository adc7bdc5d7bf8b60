-- Jobs that wait without holding a worker: the status 'waiting', what a job waits for, its
-- recorded steps and the signals sent to it (models/db/schema/75_waiting.sql says how they work).

ALTER TABLE jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_check CHECK (status IN
    ('queued', 'leased', 'cancel_requested', 'waiting', 'completed', 'failed', 'cancelled'));
ALTER TABLE jobs ADD COLUMN wait_until timestamptz, ADD COLUMN wait_signal text,
    ADD COLUMN wait_children integer;
ALTER TABLE jobs ADD CONSTRAINT jobs_waiting_waits_for_something CHECK ((status = 'waiting') =
    (wait_until IS NOT NULL OR wait_signal IS NOT NULL OR wait_children IS NOT NULL));
CREATE INDEX jobs_waiting_idx ON jobs (wait_until) WHERE status = 'waiting';
DROP INDEX jobs_dedup_active_idx;
CREATE UNIQUE INDEX jobs_dedup_active_idx ON jobs (organization_id, kind, dedup_key)
    WHERE dedup_key IS NOT NULL AND status IN ('queued', 'leased', 'cancel_requested', 'waiting');
GRANT SELECT (wait_until, wait_signal, wait_children) ON jobs
    TO space_app, space_worker, space_operator;
GRANT UPDATE (wait_until, wait_signal, wait_children) ON jobs TO space_worker;

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
    NEW.updated_at := now();
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION recount_active_jobs() RETURNS void
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    LOCK TABLE jobs IN SHARE MODE;
    LOCK TABLE active_job_counts IN EXCLUSIVE MODE;
    DELETE FROM active_job_counts;
    INSERT INTO active_job_counts (organization_id, kind, slot, active)
    SELECT j.organization_id, j.kind, 0, count(*) FROM jobs j
    WHERE j.status IN ('queued', 'leased', 'cancel_requested', 'waiting')
    GROUP BY j.organization_id, j.kind;
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
    PERFORM add_active_jobs(array_agg(n.organization_id), array_agg(n.kind), array_agg(1))
    FROM new_jobs n WHERE n.status IN ('queued', 'leased', 'cancel_requested', 'waiting');
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION jobs_after_update() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
-- PL/pgSQL keeps each statement's first plan for the session, and a transition table has no
-- statistics: a plan made for a one-row update joined new_jobs to old_jobs by nested loop ever
-- after, comparing every new row with every old one (revision 0022). Hash joins instead, and
-- no JIT: the cost of the LATERAL's nested loop, disabled but still the only way, would pass
-- jit_above_cost and LLVM would compile the metrics statement on every call (~300 ms).
SET enable_nestloop = off SET jit = off AS $$
BEGIN
    INSERT INTO job_events (job_id, organization_id, from_status, to_status, attempt, actor)
    SELECT n.id, n.organization_id, o.status, n.status, n.attempts,
           coalesce(nullif(current_setting('app.actor', true), ''), current_user)
    FROM new_jobs n JOIN old_jobs o ON o.id = n.id
    WHERE n.status <> o.status OR n.attempts <> o.attempts;

    INSERT INTO metric_events (name, kind, label, value)
    SELECT m.name, t.kind, m.label, sum(m.value)
    FROM (
        SELECT n.kind,
               -- queue wait: created -> first lease; duration: first lease -> finish
               CASE WHEN o.status = 'queued' AND n.status = 'leased' AND o.attempts = 0
                    THEN extract(epoch FROM clock_timestamp() - n.created_at) END AS wait_s,
               CASE WHEN n.status IN ('completed', 'failed', 'cancelled') AND n.status <> o.status
                         AND n.started_at IS NOT NULL
                    THEN extract(epoch FROM clock_timestamp() - n.started_at) END AS run_s,
               CASE WHEN n.status IN ('completed', 'failed', 'cancelled') AND n.status <> o.status
                    THEN n.status END AS finished_as,
               o.status IN ('leased', 'cancel_requested') AND o.lease_until < now()
                   AND (n.status <> o.status OR n.lease_token IS DISTINCT FROM o.lease_token) AS expired
        FROM new_jobs n JOIN old_jobs o ON o.id = n.id
        WHERE n.status <> o.status OR n.attempts <> o.attempts
    ) AS t
    CROSS JOIN LATERAL (VALUES
        ('spacejobs_job_queue_wait_seconds_bucket', metric_bucket(t.wait_s), 1.0, t.wait_s IS NOT NULL),
        ('spacejobs_job_queue_wait_seconds_sum', '', t.wait_s, t.wait_s IS NOT NULL),
        ('spacejobs_jobs_finished_total', t.finished_as, 1.0, t.finished_as IS NOT NULL),
        ('spacejobs_job_duration_seconds_bucket', metric_bucket(t.run_s), 1.0, t.run_s IS NOT NULL),
        ('spacejobs_job_duration_seconds_sum', '', t.run_s, t.run_s IS NOT NULL),
        ('spacejobs_leases_expired_total', '', 1.0, t.expired)
    ) AS m (name, label, value, wanted)
    WHERE m.wanted
    GROUP BY m.name, t.kind, m.label;

    PERFORM add_active_jobs(array_agg(c.organization_id), array_agg(c.kind), array_agg(c.delta))
    FROM (SELECT o.organization_id, o.kind, -1 AS delta FROM old_jobs o
          WHERE o.status IN ('queued', 'leased', 'cancel_requested', 'waiting')
          UNION ALL
          SELECT n.organization_id, n.kind, 1 FROM new_jobs n
          WHERE n.status IN ('queued', 'leased', 'cancel_requested', 'waiting')) AS c;

    -- Parents waiting for their children: a child that ended lets its parent go on (spawn the
    -- next ones, or collect). The parents' rows are locked first, in id order, so a parent
    -- going to wait at this moment (wait_job() locks its row too) either waits before this
    -- and is resumed here, or counts this child as ended when it looks.
    -- (Only when a child ended: the resume below is an UPDATE of jobs too, and this trigger,
    -- which then runs for it, must find nothing to do.)
    IF EXISTS (SELECT 1 FROM new_jobs n JOIN old_jobs o ON o.id = n.id
               WHERE n.parent_id IS NOT NULL AND n.status <> o.status
                 AND n.status IN ('completed', 'failed', 'cancelled')) THEN
        PERFORM 1 FROM jobs p
        WHERE p.id IN (SELECT n.parent_id FROM new_jobs n JOIN old_jobs o ON o.id = n.id
                       WHERE n.parent_id IS NOT NULL AND n.status <> o.status
                         AND n.status IN ('completed', 'failed', 'cancelled'))
        ORDER BY p.id FOR UPDATE;
        UPDATE jobs p SET status = 'queued', run_after = now(), last_wakeup_at = NULL
        WHERE p.status = 'waiting' AND p.wait_children IS NOT NULL
          AND p.id IN (SELECT n.parent_id FROM new_jobs n JOIN old_jobs o ON o.id = n.id
                       WHERE n.parent_id IS NOT NULL AND n.status <> o.status
                         AND n.status IN ('completed', 'failed', 'cancelled'));
        IF FOUND THEN
            PERFORM pg_notify('spacejobs_jobs', '');
        END IF;
    END IF;

    -- Jobs that just ended, for whoever waits on them (models/jobs/waiting.py): their ids, at
    -- most 200 to a notification (a payload holds 8,000 bytes). Delivered at COMMIT, like the
    -- row itself; a waiter re-reads the row, the truth, in any case.
    PERFORM pg_notify('spacejobs_finished', chunk.ids)
    FROM (SELECT string_agg(e.id::text, ',') AS ids
          FROM (SELECT n.id, (row_number() OVER ()) / 200 AS part
                FROM new_jobs n JOIN old_jobs o ON o.id = n.id
                WHERE n.status IN ('completed', 'failed', 'cancelled') AND n.status <> o.status) e
          GROUP BY e.part) AS chunk;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION jobs_after_delete() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    DELETE FROM job_events e USING gone_jobs g WHERE e.job_id = g.id;
    PERFORM add_active_jobs(array_agg(g.organization_id), array_agg(g.kind), array_agg(-1))
    FROM gone_jobs g WHERE g.status IN ('queued', 'leased', 'cancel_requested', 'waiting');
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION cancel_children(p_parent uuid, p_token uuid) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    touched integer;
BEGIN
    UPDATE jobs c
    SET status = CASE WHEN c.status IN ('queued', 'waiting') THEN 'cancelled'
                      ELSE 'cancel_requested' END,
        cancel_requested_at = now(), cancel_requested_by = p.cancel_requested_by
    FROM jobs p
    WHERE p.id = p_parent AND p.lease_token = p_token
      AND p.status IN ('leased', 'cancel_requested')
      AND c.parent_id = p.id AND c.status IN ('queued', 'leased', 'waiting');
    GET DIAGNOSTICS touched = ROW_COUNT;
    RETURN touched;
END $$;

-- Jobs that wait without holding a worker: a timer, a signal, their children. A waiting job
-- holds no lease; the database itself puts it back in the queue when what it waits for has
-- come (resume_due_waits() for timers and lost resumes, signal_job() for signals, the jobs
-- trigger for children), and the kind runs again from the top, its recorded steps answered from
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
-- has already come (a signal sent meanwhile, a moment passed, no child left active): then it
-- is queued again at once. The job's row is locked first, so a signal_job() or a child's end at
-- this moment is either seen here or sees the job waiting. Returns the job's new status, or NULL
-- when the caller no longer holds the lease (cancel_requested: the caller acknowledges the cancel).
CREATE FUNCTION wait_job(p_id uuid, p_token uuid, p_until timestamptz, p_signal text,
                         p_children boolean)
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
    IF p_children THEN
        SELECT count(*) INTO active_children FROM jobs c
        WHERE c.parent_id = p_id AND c.status IN ('queued', 'leased', 'cancel_requested', 'waiting');
    END IF;
    met := (p_until IS NOT NULL AND p_until <= now())
        OR (p_signal IS NOT NULL AND EXISTS (
                SELECT 1 FROM job_signals s
                WHERE s.job_id = p_id AND s.name = p_signal AND s.taken_at IS NULL))
        OR (p_children AND active_children = 0)
        OR (p_until IS NULL AND p_signal IS NULL AND NOT coalesce(p_children, false));
    UPDATE jobs j
    SET status = CASE WHEN met THEN 'queued' ELSE 'waiting' END,
        attempts = j.attempts - 1, run_after = now(),
        lease_token = NULL, lease_until = NULL, leased_by = NULL,
        last_wakeup_at = CASE WHEN met THEN NULL ELSE now() END,
        wait_until = CASE WHEN met THEN NULL ELSE p_until END,
        wait_signal = CASE WHEN met THEN NULL ELSE p_signal END,
        wait_children = CASE WHEN met OR NOT coalesce(p_children, false) THEN NULL
                             ELSE active_children END
    WHERE j.id = p_id;
    RETURN CASE WHEN met THEN 'queued' ELSE 'waiting' END;
END $$;
REVOKE ALL ON FUNCTION wait_job(uuid, uuid, timestamptz, text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION wait_job(uuid, uuid, timestamptz, text, boolean) TO space_worker;

-- The sweeper's resumes, bounded per call: waiting jobs whose moment has come (a timer, a
-- signal's timeout), and, as the floor under the trigger, parents with fewer children active
-- than when they began to wait (a child that ended at the very moment they did). Returns the
-- resumed jobs, to wake workers for them.
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
                         AND c.status IN ('queued', 'leased', 'cancel_requested', 'waiting'))))
        ORDER BY j.wait_until NULLS LAST
        LIMIT least(greatest(p_batch, 1), 10000)
        FOR UPDATE SKIP LOCKED
    )
    UPDATE jobs j SET status = 'queued', run_after = now(), last_wakeup_at = now()
    FROM due WHERE j.id = due.id
    RETURNING j.id, j.kind;
END $$;
REVOKE ALL ON FUNCTION resume_due_waits(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION resume_due_waits(integer) TO space_worker;

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
