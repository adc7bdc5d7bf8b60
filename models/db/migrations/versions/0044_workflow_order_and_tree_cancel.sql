-- A workflow keeps its order across an empty group: a step may run after places whose results
-- it does not read (job_workflow_steps.waits, start_workflow()'s p_waits). A cancel takes the
-- whole tree: a job cancelled or asked to stop stops its children, and the jobs trigger, run
-- again for them, stops theirs (stop_children()); the cancels lock the tree from its leaves up
-- (lock_tree()), the order a child's finish takes.

ALTER TABLE job_workflow_steps ADD COLUMN waits integer[] NOT NULL DEFAULT '{}';

-- The steps of these workflows whose dependencies (after and waits) have all completed, made
-- now, under a parent that is not stopping, and not after a failure under fail_fast, in place
-- order and no more than max_parallel unfinished. Only steps that wait for one of p_completed
-- (places that just completed) are looked at, or all when it is NULL or the workflow has a
-- max_parallel (a step ready before may have waited for room). A step's params name the places
-- whose results it reads ("_after", replacing any such key of the caller's), not the results
-- themselves. Each step
-- made takes the place its workflow reserved for it (submit_job(), start_workflow()). The
-- callers hold the parents' rows locked. Returns how many were made.
CREATE OR REPLACE FUNCTION release_steps(p_parents uuid[], p_completed integer[]) RETURNS integer
LANGUAGE plpgsql SET search_path = public, pg_temp
-- As release_children(): index probes, whatever the calling trigger turned off.
SET enable_nestloop = on AS $$
DECLARE
    made integer;
BEGIN
    WITH candidates AS (
        SELECT s.parent_id, s.place, w.max_parallel - (w.released - w.ended) AS room,
               row_number() OVER (PARTITION BY s.parent_id ORDER BY s.place) AS nth
        FROM job_workflow_steps s
        JOIN job_workflows w ON w.parent_id = s.parent_id
        JOIN jobs p ON p.id = s.parent_id
        WHERE s.parent_id = ANY (p_parents) AND p.status IN ('queued', 'leased', 'waiting')
          AND (p_completed IS NULL OR w.max_parallel IS NOT NULL
               OR s.after && p_completed OR s.waits && p_completed)
          AND NOT (w.policy = 'fail_fast' AND w.failed > 0)
          AND NOT EXISTS (
                SELECT 1 FROM unnest(s.after || s.waits) AS d (place)
                LEFT JOIN jobs c ON c.parent_id = s.parent_id AND c.child_index = d.place
                WHERE c.status IS DISTINCT FROM 'completed')
    ), ready AS (
        SELECT c.parent_id, c.place FROM candidates c WHERE c.room IS NULL OR c.nth <= c.room
    ), taken AS (
        DELETE FROM job_workflow_steps s USING ready r
        WHERE s.parent_id = r.parent_id AND s.place = r.place
        RETURNING s.parent_id, s.place, s.kind, s.params, s.after, s.max_attempts, s.lease_seconds
    ), counted AS (
        UPDATE job_workflows w SET released = w.released + t.n
        FROM (SELECT parent_id, count(*)::integer AS n FROM taken GROUP BY parent_id) AS t
        WHERE w.parent_id = t.parent_id
    ), inserted AS (
        INSERT INTO jobs (organization_id, requested_by, kind, params, max_attempts, lease_seconds,
                          request_id, parent_id, child_index)
        SELECT p.organization_id, p.requested_by, t.kind,
               t.params || jsonb_build_object('_after', to_jsonb(t.after)),
               t.max_attempts, t.lease_seconds, p.request_id, p.id, t.place
        FROM taken t JOIN jobs p ON p.id = t.parent_id
        ORDER BY t.parent_id, t.place
        ON CONFLICT (parent_id, child_index) WHERE parent_id IS NOT NULL DO NOTHING
        RETURNING jobs.parent_id, jobs.kind
    ), moved AS (
        UPDATE job_reservations r SET reserved = r.reserved - least(r.reserved, i.n)
        FROM (SELECT c.parent_id, c.kind, count(*)::integer AS n FROM inserted c
              GROUP BY c.parent_id, c.kind) AS i
        WHERE r.parent_id = i.parent_id AND r.kind = i.kind
    )
    SELECT count(*) INTO made FROM inserted;
    RETURN made;
END $$;
REVOKE ALL ON FUNCTION release_steps(uuid[], integer[]) FROM PUBLIC;

DROP FUNCTION start_workflow(uuid, uuid, text, integer, text[], jsonb[], jsonb[], integer[],
                             integer[], integer[]);
-- The parent's workflow, for the worker holding its lease: its steps (place = position in the
-- arrays; p_after: each step's places as a JSON array; p_waits: the places each runs after
-- without reading their results, NULL for none), at most p_max_parallel unfinished at a
-- time (NULL: no bound), and the steps ready at once, in one transaction. Every step counts as
-- an active job from then on: the steps beyond those its submit already reserved (a kind's own
-- ctx.workflow reserved none) are admitted against the quotas first (the organization's cap is
-- the database's; p_quotas are the steps' kinds' declared ones); over a cap nothing is
-- recorded, and refused_kind and cap say which. A workflow already started is left as it is;
-- steps the parent made before, one by one (before revision 0033), count as released. Returns
-- the workflow, or no row when the lease is no longer the caller's or a cancel was asked for.
CREATE FUNCTION start_workflow(p_parent uuid, p_token uuid, p_policy text, p_max_parallel integer,
                               p_kinds text[], p_params jsonb[], p_after jsonb[],
                               p_max_attempts integer[], p_lease_seconds integer[],
                               p_quotas integer[] DEFAULT NULL, p_waits jsonb[] DEFAULT NULL)
RETURNS TABLE (total integer, released integer, ended integer, failed integer,
               refused_kind text, cap integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    parent jobs;
    unreserved text[];
    unreserved_caps integer[];
    refusal record;
BEGIN
    SELECT * INTO parent FROM jobs j
    WHERE j.id = p_parent AND j.lease_token = p_token AND j.status = 'leased' FOR UPDATE;
    IF parent.id IS NULL THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM job_workflows w WHERE w.parent_id = p_parent) THEN
        -- The steps not made yet, one entry each, less those already reserved per kind.
        SELECT coalesce(array_agg(n.kind), '{}'), coalesce(array_agg(n.cap), '{}')
        INTO unreserved, unreserved_caps
        FROM (SELECT s.kind, s.cap,
                     row_number() OVER (PARTITION BY s.kind ORDER BY s.place) AS nth
              FROM unnest(p_kinds, coalesce(p_quotas, array_fill(NULL::integer,
                                                                 ARRAY[cardinality(p_kinds)])))
                       WITH ORDINALITY AS s (kind, cap, place)
              WHERE NOT EXISTS (SELECT 1 FROM jobs c
                                WHERE c.parent_id = p_parent AND c.child_index = s.place - 1)
             ) AS n
        LEFT JOIN job_reservations r ON r.parent_id = p_parent AND r.kind = n.kind
        WHERE n.nth > coalesce(r.reserved, 0);
        IF cardinality(unreserved) > 0 THEN
            SELECT * INTO refusal
            FROM admit_jobs(parent.organization_id, unreserved, unreserved_caps,
                            (SELECT q.active_jobs FROM quota_policy q), false);
            IF FOUND THEN
                RETURN QUERY SELECT NULL::integer, NULL::integer, NULL::integer, NULL::integer,
                                    refusal.refused_kind, refusal.cap;
                RETURN;
            END IF;
            PERFORM reserve_children(p_parent, parent.organization_id, unreserved);
        END IF;
        INSERT INTO job_workflows (parent_id, policy, max_parallel, total, released, ended, failed)
        SELECT p_parent, p_policy,
               CASE WHEN p_max_parallel IS NOT NULL THEN greatest(p_max_parallel, 1) END,
               coalesce(cardinality(p_kinds), 0),
               count(*),
               count(*) FILTER (WHERE c.status IN ('completed', 'failed', 'cancelled')),
               count(*) FILTER (WHERE c.status IN ('failed', 'cancelled'))
        FROM jobs c WHERE c.parent_id = p_parent;
        INSERT INTO job_workflow_steps (parent_id, place, kind, params, after, waits,
                                        max_attempts, lease_seconds)
        SELECT p_parent, s.place - 1, s.kind, s.params,
               ARRAY(SELECT jsonb_array_elements_text(s.after)::integer),
               ARRAY(SELECT jsonb_array_elements_text(coalesce(s.waits, '[]'))::integer),
               least(greatest(s.max_attempts, 1), 100), least(greatest(s.lease_seconds, 1), 86400)
        FROM unnest(p_kinds, p_params, p_after, p_max_attempts, p_lease_seconds,
                    coalesce(p_waits, array_fill(NULL::jsonb, ARRAY[cardinality(p_kinds)])))
                 WITH ORDINALITY AS s (kind, params, after, max_attempts, lease_seconds, waits,
                                       place)
        WHERE NOT EXISTS (SELECT 1 FROM jobs c
                          WHERE c.parent_id = p_parent AND c.child_index = s.place - 1);
        PERFORM release_steps(ARRAY[p_parent], NULL);
    END IF;
    RETURN QUERY SELECT w.total, w.released, w.ended, w.failed, NULL::text, NULL::integer
    FROM job_workflows w WHERE w.parent_id = p_parent;
END $$;
REVOKE ALL ON FUNCTION start_workflow(uuid, uuid, text, integer, text[], jsonb[], jsonb[],
                                      integer[], integer[], integer[], jsonb[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION start_workflow(uuid, uuid, text, integer, text[], jsonb[], jsonb[],
                                         integer[], integer[], integer[], jsonb[]) TO space_worker;

-- The children of parents that were cancelled or asked to stop: queued and waiting ones end at
-- once, running ones are asked to stop, as a user's cancel would, by whoever asked for the
-- parent's. Called by the jobs trigger only (as the owner), which runs again for these children
-- and so stops the whole tree. The cancels lock the tree from its leaves up first
-- (lock_for_cancel in store.sql, lock_tree()), the order a child's finish locks it and then its
-- parent.
CREATE FUNCTION stop_children(p_parents uuid[]) RETURNS void
LANGUAGE plpgsql SET search_path = public, pg_temp
-- Index probes by parent, whatever the calling trigger turned off.
SET enable_nestloop = on AS $$
BEGIN
    UPDATE jobs c
    SET status = CASE WHEN c.status IN ('queued', 'waiting') THEN 'cancelled'
                      ELSE 'cancel_requested' END,
        cancel_requested_at = now(), cancel_requested_by = p.cancel_requested_by
    FROM jobs p
    WHERE p.id = ANY (p_parents) AND c.parent_id = p.id
      AND c.status IN ('queued', 'leased', 'waiting');
END $$;
REVOKE ALL ON FUNCTION stop_children(uuid[]) FROM PUBLIC;

-- A job and its tree of unfinished jobs below it, locked from the leaves up, in id order at
-- each depth: a child's finish locks the child and then its parent (the jobs trigger), so a
-- cancel, which will stop the whole tree (stop_children()), takes the same order and the two
-- never deadlock. With the caller's rights: the web's cancel (store.sql, lock_for_cancel) locks
-- only what its organization's row-level security shows it.
CREATE FUNCTION lock_tree(p_root uuid) RETURNS void
LANGUAGE plpgsql SET search_path = public, pg_temp SET enable_nestloop = on AS $$
BEGIN
    PERFORM 1
    FROM jobs j
    JOIN (WITH RECURSIVE tree AS (
              SELECT p_root AS id, 0 AS depth
              UNION ALL
              SELECT c.id, t.depth + 1 FROM tree t JOIN jobs c ON c.parent_id = t.id
              WHERE c.status IN ('queued', 'leased', 'cancel_requested', 'waiting')
          ) SELECT tree.id, tree.depth FROM tree) AS t ON t.id = j.id
    ORDER BY t.depth DESC, j.id
    FOR NO KEY UPDATE OF j;
END $$;
REVOKE ALL ON FUNCTION lock_tree(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_tree(uuid) TO space_app;

-- A cancelled parent's children: queued and waiting ones end at once, running ones are asked to
-- stop, as a user's cancel would, and theirs after them (the jobs trigger, stop_children()).
-- For the worker holding the parent's lease. Returns how many children it touched.
CREATE OR REPLACE FUNCTION cancel_children(p_parent uuid, p_token uuid) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    touched integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM jobs p WHERE p.id = p_parent AND p.lease_token = p_token
                                          AND p.status IN ('leased', 'cancel_requested')) THEN
        RETURN 0;
    END IF;
    PERFORM lock_tree(p_parent);
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
REVOKE ALL ON FUNCTION cancel_children(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cancel_children(uuid, uuid) TO space_worker;

-- Updated jobs: an event per status change (and per re-lease after expiry, which is a new
-- attempt), and the metric events, summed per statement: a batch of 100 finishes adds one
-- 'finished' row with value 100, not 100 rows. Jobs that stop being active leave
-- active_job_counts in the same statement.
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

