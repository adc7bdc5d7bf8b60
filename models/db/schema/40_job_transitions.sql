-- Job triggers: transitions are enforced here, whatever client writes the row; the events,
-- metric events, active counts and notifications of every change are written here too, in
-- the statement that makes it.

CREATE FUNCTION jobs_check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER jobs_check_transition BEFORE UPDATE ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_check_transition();

-- Adds the jobs that became active (+1) or stopped being active (-1), one entry per job, to
-- active_job_counts, summed per (organization, kind). The rows written are the calling
-- transaction's slot's: the first of 64 advisory locks it can take (or already holds), held
-- until it ends, so no other transaction writes those rows meanwhile and nobody waits on them.
-- Only with all 64 held by other writers does it share slot pid % 64, whose row locks then
-- order the writers. Called by the jobs triggers only (as the owner). Each key's row is
-- written by its whole key, one probe of the table's key, in one generic plan a session: a
-- scan of the slot's rows (by the key's third column, or the whole table) reads every version
-- of every organization's counts that a long-open transaction keeps, and a plan made for each
-- call's values, cheaper on paper every time, would be made again at every submit and finish.
CREATE FUNCTION add_active_jobs(p_organization_ids uuid[], p_kinds text[], p_deltas integer[])
RETURNS void LANGUAGE plpgsql SET search_path = public, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    slots CONSTANT integer := 64;
    lock_key CONSTANT integer := hashtext('spacejobs.active_job_counts');
    orgs uuid[];
    kinds text[];
    deltas bigint[];
    mine integer;
BEGIN
    -- A claim or a heartbeat moves jobs between active statuses: nothing to add, no slot taken.
    SELECT array_agg(d.organization_id ORDER BY d.organization_id, d.kind),
           array_agg(d.kind ORDER BY d.organization_id, d.kind),
           array_agg(d.delta ORDER BY d.organization_id, d.kind)
    INTO orgs, kinds, deltas
    FROM (SELECT u.organization_id, u.kind, sum(u.delta) AS delta
          FROM unnest(p_organization_ids, p_kinds, p_deltas) AS u (organization_id, kind, delta)
          GROUP BY u.organization_id, u.kind
          HAVING sum(u.delta) <> 0) AS d;
    IF orgs IS NULL THEN
        RETURN;
    END IF;
    FOR i IN 0 .. slots - 1 LOOP
        IF pg_try_advisory_xact_lock(lock_key, i) THEN
            mine := i;
            EXIT;
        END IF;
    END LOOP;
    IF mine IS NULL THEN
        -- All 64 held by other writers: slot pid % 64, shared, its rows written in the order
        -- of their keys.
        INSERT INTO active_job_counts AS c (organization_id, kind, slot, active)
        SELECT d.organization_id, d.kind, pg_backend_pid() % slots, d.delta
        FROM unnest(orgs, kinds, deltas) WITH ORDINALITY AS d (organization_id, kind, delta, ord)
        ORDER BY d.ord
        ON CONFLICT (organization_id, kind, slot) DO UPDATE SET active = c.active + excluded.active;
        RETURN;
    END IF;
    -- The slot's row of each key updated in place: INSERT ... ON CONFLICT DO UPDATE would
    -- first lock the row, a WAL record more per submit and finish.
    FOR i IN 1 .. cardinality(orgs) LOOP
        UPDATE active_job_counts c SET active = c.active + deltas[i]
        WHERE c.organization_id = orgs[i] AND c.kind = kinds[i] AND c.slot = mine;
        IF NOT FOUND THEN
            INSERT INTO active_job_counts AS c (organization_id, kind, slot, active)
            VALUES (orgs[i], kinds[i], mine, deltas[i])
            ON CONFLICT (organization_id, kind, slot)
                DO UPDATE SET active = c.active + excluded.active;
        END IF;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION add_active_jobs(uuid[], text[], integer[]) FROM PUBLIC;

-- The counts again from the jobs and the reservations themselves, for a database whose rows
-- were written with the triggers disabled (pg_restore --disable-triggers). The owner runs it;
-- writers wait meanwhile.
CREATE FUNCTION recount_active_jobs() RETURNS void
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    LOCK TABLE jobs IN SHARE MODE;
    LOCK TABLE job_reservations IN SHARE MODE;
    LOCK TABLE active_job_counts IN EXCLUSIVE MODE;
    DELETE FROM active_job_counts;
    INSERT INTO active_job_counts (organization_id, kind, slot, active)
    SELECT c.organization_id, c.kind, 0, sum(c.n) FROM (
        SELECT j.organization_id, j.kind, count(*) AS n FROM jobs j
        WHERE j.status IN ('queued', 'leased', 'cancel_requested', 'waiting')
        GROUP BY j.organization_id, j.kind
        UNION ALL
        SELECT r.organization_id, r.kind, sum(r.reserved) FROM job_reservations r
        GROUP BY r.organization_id, r.kind) AS c
    GROUP BY c.organization_id, c.kind;
END $$;
REVOKE ALL ON FUNCTION recount_active_jobs() FROM PUBLIC;

-- Reservations count as active jobs of their kind (30_jobs.sql job_reservations): whatever
-- writes them, these triggers move active_job_counts by the same amount in the same statement.
CREATE FUNCTION job_reservations_counted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM add_active_jobs(array_agg(n.organization_id), array_agg(n.kind), array_agg(n.reserved))
        FROM new_reservations n;
    ELSIF TG_OP = 'UPDATE' THEN
        PERFORM add_active_jobs(array_agg(n.organization_id), array_agg(n.kind),
                                array_agg(n.reserved - o.reserved))
        FROM new_reservations n JOIN old_reservations o
             ON o.parent_id = n.parent_id AND o.kind = n.kind;
    ELSE
        PERFORM add_active_jobs(array_agg(o.organization_id), array_agg(o.kind), array_agg(-o.reserved))
        FROM old_reservations o;
    END IF;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION job_reservations_counted() FROM PUBLIC;

CREATE TRIGGER job_reservations_inserted AFTER INSERT ON job_reservations
    REFERENCING NEW TABLE AS new_reservations
    FOR EACH STATEMENT EXECUTE FUNCTION job_reservations_counted();
CREATE TRIGGER job_reservations_updated AFTER UPDATE ON job_reservations
    REFERENCING OLD TABLE AS old_reservations NEW TABLE AS new_reservations
    FOR EACH STATEMENT EXECUTE FUNCTION job_reservations_counted();
CREATE TRIGGER job_reservations_deleted AFTER DELETE ON job_reservations
    REFERENCING OLD TABLE AS old_reservations
    FOR EACH STATEMENT EXECUTE FUNCTION job_reservations_counted();

-- Inserted jobs: one NOTIFY per statement for workers that LISTEN (a wake-up faster than the
-- broker's; the broker's wake-up and the sweeper remain the guarantee, NOTIFY is only a
-- shortcut). A job's birth is no event row: job_history reads it from the job's row. A row the
-- owner plants in another state gets the event that takes it there from 'queued'.
-- SECURITY DEFINER: job_events is written by this function only, whoever inserted the job.
CREATE FUNCTION jobs_after_insert() RETURNS trigger
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
    SELECT n.id, n.organization_id, 'queued', n.status, n.attempts,
           coalesce(app_actor(), 'user:' || n.requested_by)
    FROM new_jobs n WHERE n.status <> 'queued';
    IF EXISTS (SELECT FROM new_jobs) THEN
        PERFORM pg_notify('spacejobs_jobs', '');
    END IF;
    PERFORM add_active_jobs(array_agg(n.organization_id), array_agg(n.kind), array_agg(1))
    FROM new_jobs n WHERE n.status IN ('queued', 'leased', 'cancel_requested', 'waiting');
    -- Jobs born queued: no head of their keys is further on than they are.
    PERFORM lower_claim_heads(array_agg(n.organization_id), array_agg(n.priority),
                              array_agg(n.run_after), array_agg(n.created_at))
    FROM new_jobs n WHERE n.status = 'queued' HAVING count(*) > 0;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION jobs_after_insert() FROM PUBLIC;

CREATE TRIGGER jobs_after_insert AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_after_insert();

-- Updated jobs: an event per status change (and per re-lease after expiry, which is a new
-- attempt), and the metric events, summed per statement: a batch of 100 finishes adds one
-- 'finished' row with value 100, not 100 rows. Jobs that stop being active leave
-- active_job_counts in the same statement.
CREATE FUNCTION jobs_after_update() RETURNS trigger
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
    -- was: from the queue, by the process it names, at its moment. The join keeps only the
    -- rows with something to store, which a worker's claim and finish have none of: the list's
    -- expressions (the actor's setting, the clock) are worked out for every row the join
    -- yields, before the list's own filter: nearly half the trigger's time in a claim.
    INSERT INTO job_events (job_id, organization_id, from_status, to_status, attempt, actor, at)
    SELECT n.id, n.organization_id, e.from_status, e.to_status, e.attempt, e.actor, e.at
    FROM new_jobs n JOIN old_jobs o ON o.id = n.id
        AND n.lease_event_at IS NULL
        AND (o.lease_event_at IS NOT NULL OR n.status <> o.status OR n.attempts <> o.attempts)
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
REVOKE ALL ON FUNCTION jobs_after_update() FROM PUBLIC;

CREATE TRIGGER jobs_after_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_after_update();

-- A job's events and its count as active go with it: retention, an organization's deletion
-- (cascading to its jobs), TRUNCATE.
CREATE FUNCTION jobs_after_delete() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    DELETE FROM job_events e USING gone_jobs g WHERE e.job_id = g.id;
    PERFORM add_active_jobs(array_agg(g.organization_id), array_agg(g.kind), array_agg(-1))
    FROM gone_jobs g WHERE g.status IN ('queued', 'leased', 'cancel_requested', 'waiting');
    DELETE FROM job_reservations r USING gone_jobs g WHERE r.parent_id = g.id;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION jobs_after_delete() FROM PUBLIC;

CREATE TRIGGER jobs_after_delete AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS gone_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_after_delete();

CREATE FUNCTION jobs_after_truncate() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    TRUNCATE job_events;
    TRUNCATE job_reservations;
    TRUNCATE active_job_counts;
    TRUNCATE claim_heads;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION jobs_after_truncate() FROM PUBLIC;

CREATE TRIGGER jobs_after_truncate AFTER TRUNCATE ON jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_after_truncate();
