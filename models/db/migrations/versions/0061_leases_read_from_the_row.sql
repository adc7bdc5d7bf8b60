-- Revision 0061: a job that ran once and completed writes no job_events row: its lease and its
-- completion are read from its row (issue 32, a job's WAL).
--
-- After revision 0060 a job's lease and completion were its only two stored events in the
-- common case: two rows and their keys, 495 of the 2,984 bytes of WAL a job wrote over its
-- life (bench.cost). jobs.lease_event_at (new) holds the moment of a lease taken from the
-- queue by the process the transaction's actor names (jobs_check_transition() sets it in the
-- claim's own row version); it stays while that lease ends in its completion by the same
-- process, and complete_jobs() now leaves leased_by on the row, so the completed job names
-- the process that completed it. Any other move drops it, and jobs_after_update() stores the
-- lease as it was, then the move. job_history reads the lease and completion a row holds after
-- the stored events. CREATE OR REPLACE keeps the functions' grants and the triggers.
-- Existing jobs: lease_event_at is NULL, so their stored events stay as they are, and a lease
-- held now ends in stored events, as before.

ALTER TABLE jobs ADD COLUMN lease_event_at timestamptz;
ALTER TABLE jobs ADD CONSTRAINT jobs_lease_event_on_row CHECK (lease_event_at IS NULL
                                              OR status IN ('leased', 'completed')) NOT VALID;
ALTER TABLE jobs VALIDATE CONSTRAINT jobs_lease_event_on_row;
GRANT SELECT (lease_event_at) ON jobs TO space_app, space_worker, space_operator;

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
    -- The lease its row holds for the history (jobs.lease_event_at, job_history): one taken
    -- from the queue by the process the transaction's actor names (a worker's claim), kept
    -- while that lease ends in its completion by the same process. Any other move drops it,
    -- and jobs_after_update() stores it as an event.
    IF NEW.status <> OLD.status OR NEW.attempts <> OLD.attempts THEN
        NEW.lease_event_at := CASE
            WHEN OLD.status = 'queued' AND NEW.status = 'leased'
                 AND current_setting('app.actor', true) = 'worker:' || NEW.leased_by
                THEN clock_timestamp()
            WHEN OLD.status = 'leased' AND NEW.status = 'completed'
                 AND NEW.attempts = OLD.attempts AND NEW.leased_by = OLD.leased_by
                 AND current_setting('app.actor', true) = 'worker:' || OLD.leased_by
                THEN OLD.lease_event_at
        END;
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
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
    -- A lease or completion the row holds (lease_event_at) is not stored; a lease it held and
    -- this move drops (a retry, a wait, a cancel asked for, an expiry) is stored first, as it
    -- was: from the queue, by the process it names, at its moment.
    INSERT INTO job_events (job_id, organization_id, from_status, to_status, attempt, actor, at)
    SELECT n.id, n.organization_id, e.from_status, e.to_status, e.attempt, e.actor, e.at
    FROM new_jobs n JOIN old_jobs o ON o.id = n.id
    CROSS JOIN LATERAL (VALUES
        (1, 'queued', 'leased', o.attempts, 'worker:' || o.leased_by, o.lease_event_at,
         o.lease_event_at IS NOT NULL AND n.lease_event_at IS NULL),
        (2, o.status, n.status, n.attempts,
         coalesce(nullif(current_setting('app.actor', true), ''), current_user::text),
         clock_timestamp(),
         (n.status <> o.status OR n.attempts <> o.attempts) AND n.lease_event_at IS NULL)
    ) AS e (nth, from_status, to_status, attempt, actor, at, stored)
    WHERE e.stored
    ORDER BY n.id, e.nth;

    -- Counted per kind, buckets and end first, then at most six rows per group: a VALUES list
    -- joined to every job would build its expressions anew for each job. OFFSET 0 keeps t a
    -- subquery, so that metric_bucket() is given a column and inlined (given the volatile
    -- clock_timestamp() expression itself, it would run as a call of its own per row).
    INSERT INTO metric_events (name, kind, label, value)
    SELECT m.name, g.kind, m.label, sum(m.value)
    FROM (
        SELECT t.kind, metric_bucket(t.wait_s) AS wait_bucket, metric_bucket(t.run_s) AS run_bucket,
               t.finished_as, count(t.wait_s) AS waits, sum(t.wait_s) AS wait_sum,
               count(t.run_s) AS runs, sum(t.run_s) AS run_sum,
               count(t.finished_as) AS finishes, count(*) FILTER (WHERE t.expired) AS expired
        FROM (
            SELECT n.kind,
                   -- queue wait: created -> first lease; duration: first lease -> finish
                   CASE WHEN o.status = 'queued' AND n.status = 'leased' AND o.attempts = 0
                        THEN date_part('epoch', clock_timestamp() - n.created_at) END AS wait_s,
                   CASE WHEN n.status IN ('completed', 'failed', 'cancelled') AND n.status <> o.status
                             AND n.started_at IS NOT NULL
                        THEN date_part('epoch', clock_timestamp() - n.started_at) END AS run_s,
                   CASE WHEN n.status IN ('completed', 'failed', 'cancelled') AND n.status <> o.status
                        THEN n.status END AS finished_as,
                   o.status IN ('leased', 'cancel_requested') AND o.lease_until < now()
                       AND (n.status <> o.status OR n.lease_token IS DISTINCT FROM o.lease_token)
                       AS expired
            FROM new_jobs n JOIN old_jobs o ON o.id = n.id
            WHERE n.status <> o.status OR n.attempts <> o.attempts
            OFFSET 0
        ) AS t
        GROUP BY 1, 2, 3, 4
    ) AS g
    CROSS JOIN LATERAL (VALUES
        ('spacejobs_job_queue_wait_seconds_bucket', g.wait_bucket, g.waits, g.waits > 0),
        ('spacejobs_job_queue_wait_seconds_sum', '', g.wait_sum, g.waits > 0),
        ('spacejobs_jobs_finished_total', g.finished_as, g.finishes, g.finishes > 0),
        ('spacejobs_job_duration_seconds_bucket', g.run_bucket, g.runs, g.runs > 0),
        ('spacejobs_job_duration_seconds_sum', '', g.run_sum, g.runs > 0),
        ('spacejobs_leases_expired_total', '', g.expired, g.expired > 0)
    ) AS m (name, label, value, wanted)
    WHERE m.wanted
    GROUP BY m.name, g.kind, m.label;

    -- Only the jobs that became active (+1) or stopped being active (-1) count, a job's
    -- organization and kind never changing: a claim, which moves every job it takes between
    -- active statuses, counts nothing and calls nothing.
    PERFORM add_active_jobs(array_agg(c.organization_id), array_agg(c.kind), array_agg(c.delta))
    FROM (SELECT n.organization_id, n.kind,
                 (n.status IN ('queued', 'leased', 'cancel_requested', 'waiting'))::integer
                 - (o.status IN ('queued', 'leased', 'cancel_requested', 'waiting'))::integer
                     AS delta
          FROM new_jobs n JOIN old_jobs o ON o.id = n.id) AS c
    WHERE c.delta <> 0
    HAVING count(*) > 0;

    -- Jobs put back in the queue (a retry, a lease that ran out, a wait that ended, jobs a
    -- worker gave back) or moved earlier in it: no head of their keys is further on than they
    -- are.
    PERFORM lower_claim_heads(array_agg(n.organization_id), array_agg(n.priority),
                              array_agg(n.run_after), array_agg(n.created_at))
    FROM new_jobs n JOIN old_jobs o ON o.id = n.id
    WHERE n.status = 'queued'
      AND (o.status <> 'queued' OR n.organization_id <> o.organization_id
           OR n.priority <> o.priority
           OR (n.run_after, n.created_at) < (o.run_after, o.created_at))
    HAVING count(*) > 0;

    -- A parent that ended makes no more children: what it had reserved for those it never made
    -- stops counting (its reservations' trigger takes the counts back). Looked for only while
    -- any parent holds a reservation.
    IF EXISTS (SELECT 1 FROM job_reservations) THEN
        DELETE FROM job_reservations r
        USING new_jobs n JOIN old_jobs o ON o.id = n.id
        WHERE r.parent_id = n.id AND n.status IN ('completed', 'failed', 'cancelled')
          AND o.status <> n.status;
    END IF;

    -- A job cancelled, or asked to stop, takes its whole tree with it: its children stop the
    -- same way, and this trigger, run again for their update, stops theirs (stop_children()).
    IF EXISTS (SELECT 1 FROM new_jobs n JOIN old_jobs o ON o.id = n.id
               WHERE n.status IN ('cancelled', 'cancel_requested') AND o.status <> n.status) THEN
        PERFORM stop_children(array_agg(n.id))
        FROM new_jobs n JOIN old_jobs o ON o.id = n.id
        WHERE n.status IN ('cancelled', 'cancel_requested') AND o.status <> n.status;
    END IF;

    -- Parents waiting for their children: a child that ended lets its parent go on (spawn the
    -- next ones, or collect). The parents' rows are locked first, in id order, so a parent
    -- going to wait at this moment (wait_job() locks its row too) either waits before this
    -- and is resumed here, or counts this child as ended when it looks. A fan-out or a
    -- workflow the database runs (70_fan_out.sql) counts the ends and makes its next children
    -- here, in the transaction that ended these; its parent goes on only once it is settled
    -- (the last child ended; for a fail_fast workflow, also a step that did not complete).
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
        PERFORM fan_out_children_ended(array_agg(n.parent_id)),
                workflow_steps_ended(array_agg(n.parent_id), array_agg(n.child_index),
                                     array_agg(n.status = 'completed'))
        FROM new_jobs n JOIN old_jobs o ON o.id = n.id
        WHERE n.parent_id IS NOT NULL AND n.status <> o.status
          AND n.status IN ('completed', 'failed', 'cancelled');
        UPDATE jobs p SET status = 'queued', run_after = now(), last_wakeup_at = NULL
        WHERE p.status = 'waiting' AND p.wait_children IS NOT NULL
          AND p.id IN (SELECT n.parent_id FROM new_jobs n JOIN old_jobs o ON o.id = n.id
                       WHERE n.parent_id IS NOT NULL AND n.status <> o.status
                         AND n.status IN ('completed', 'failed', 'cancelled'))
          AND NOT EXISTS (SELECT 1 FROM job_fan_outs f
                          WHERE f.parent_id = p.id AND f.ended < f.total)
          AND NOT EXISTS (SELECT 1 FROM job_workflows w
                          WHERE w.parent_id = p.id AND w.ended < w.released
                            AND NOT (w.policy = 'fail_fast' AND w.failed > 0));
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

CREATE OR REPLACE FUNCTION complete_jobs(p_ids uuid[], p_tokens uuid[], p_results jsonb[], p_refs text[])
RETURNS TABLE (id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    completed uuid[];
BEGIN
    WITH done AS (
        -- leased_by stays: a completed job names the process that completed it, and the
        -- history's lease and completion its row holds read it (job_history).
        UPDATE jobs j
        SET status = 'completed', result = d.result, result_ref = d.ref, error_code = NULL,
            error_message = NULL
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

CREATE OR REPLACE VIEW job_history WITH (security_invoker = true) AS
SELECT 0::bigint AS id, j.id AS job_id, j.organization_id, NULL::text AS from_status,
       'queued'::text AS to_status, 0 AS attempt,
       coalesce(j.submitted_as, 'user:' || j.requested_by) AS actor, j.created_at AS at
FROM jobs j
WHERE current_user <> 'space_worker' OR j.organization_id = app_org()
UNION ALL
SELECT e.id, e.job_id, e.organization_id, e.from_status, e.to_status, e.attempt, e.actor, e.at
FROM job_events e
UNION ALL
SELECT l.id, j.id, j.organization_id, l.from_status, l.to_status, j.attempts,
       'worker:' || j.leased_by, l.at
FROM jobs j
CROSS JOIN LATERAL (VALUES
    (9223372036854775806, 'queued', 'leased', j.lease_event_at, true),
    -- (finished_at is its transaction's start: never before the lease when both were in one)
    (9223372036854775807, 'leased', 'completed', greatest(j.finished_at, j.lease_event_at),
     j.status = 'completed')
) AS l (id, from_status, to_status, at, held)
WHERE j.lease_event_at IS NOT NULL AND l.held
  AND (current_user <> 'space_worker' OR j.organization_id = app_org());
