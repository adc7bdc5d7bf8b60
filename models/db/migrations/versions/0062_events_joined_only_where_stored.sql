-- Revision 0062: a worker's claim and finish skip the events statement's list (issue 32, the
-- drain's database time).
--
-- jobs_after_update() built its VALUES list of a lease and a move for every row the join of
-- new_jobs and old_jobs yielded, the actor's setting and the clock included, and only then
-- kept the rows with something to store. A worker's claim and its finish store nothing, so
-- the join now keeps only the rows that do: the trigger's time in a lease of 1,000 jobs fell
-- from about 16 to 9 ms. The events written are the same. CREATE OR REPLACE keeps the
-- function's grants and its trigger.

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
