-- An organization's active jobs counted as they change, not on every submit (issue 8: a
-- submit's quota check counted every active job of the organization, up to its cap, so with
-- 5,000 queued jobs each submit read 5,000 index entries: 951 submits/s into an empty queue,
-- 580/s into one filling to 5,000). The triggers that already see every insert, update and
-- delete of jobs keep active_job_counts; admit_jobs() sums a few of its rows. The index the
-- count read goes with it: nothing else uses it, and every insert and status change paid for it.

-- An organization's active jobs (queued, leased, cancel_requested), per kind, kept up to date by
-- the jobs triggers in the statement that changes them, so that a submit's quota check reads a
-- few rows instead of counting every active job (revision 0024). The count of (organization,
-- kind) is the sum of its rows; there is one row per slot, and a slot is held by one writing
-- transaction at a time (add_active_jobs()), so concurrent writers never wait on each other's
-- row locks here. The owner's alone, like job_quotas: only the SECURITY DEFINER triggers write
-- it, only admit_jobs() reads it. No foreign key: an organization's deletion cascades to its
-- jobs, whose delete trigger takes their counts back.
CREATE TABLE active_job_counts (
    organization_id  uuid NOT NULL,
    kind             text NOT NULL,
    slot             smallint NOT NULL,
    active           bigint NOT NULL,
    PRIMARY KEY (organization_id, kind, slot)
);

-- active_job_counts: the owner's alone (the jobs triggers write, admit_jobs() reads, as the owner).
ALTER TABLE active_job_counts ENABLE ROW LEVEL SECURITY;
ALTER TABLE active_job_counts FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON active_job_counts TO space_owner USING (true) WITH CHECK (true);

-- Adds the jobs that became active (+1) or stopped being active (-1), one entry per job, to
-- active_job_counts, summed per (organization, kind). The rows written are the calling
-- transaction's slot's: the first of 64 advisory locks it can take (or already holds), held
-- until it ends, so no other transaction writes those rows meanwhile and nobody waits on them.
-- Only with all 64 held by other writers does it share slot pid % 64, whose row locks then
-- order the writers. Called by the jobs triggers only (as the owner).
CREATE FUNCTION add_active_jobs(p_organization_ids uuid[], p_kinds text[], p_deltas integer[])
RETURNS void LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
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
    INSERT INTO active_job_counts AS c (organization_id, kind, slot, active)
    SELECT d.organization_id, d.kind, coalesce(mine, pg_backend_pid() % slots), d.delta
    FROM unnest(orgs, kinds, deltas) WITH ORDINALITY AS d (organization_id, kind, delta, ord)
    ORDER BY d.ord
    ON CONFLICT (organization_id, kind, slot) DO UPDATE SET active = c.active + excluded.active;
END $$;

-- The counts again from the jobs themselves, for a database whose rows were written with the
-- triggers disabled (pg_restore --disable-triggers). The owner runs it; writers wait meanwhile.
CREATE FUNCTION recount_active_jobs() RETURNS void
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    LOCK TABLE jobs IN SHARE MODE;
    LOCK TABLE active_job_counts IN EXCLUSIVE MODE;
    DELETE FROM active_job_counts;
    INSERT INTO active_job_counts (organization_id, kind, slot, active)
    SELECT j.organization_id, j.kind, 0, count(*) FROM jobs j
    WHERE j.status IN ('queued', 'leased', 'cancel_requested')
    GROUP BY j.organization_id, j.kind;
END $$;

DROP FUNCTION active_jobs(uuid, text, integer);

-- How many active jobs the organization (p_kind NULL) or one kind of it has, as committed when
-- the calling statement began: the sum of its rows in active_job_counts, a few rows whatever
-- the number of jobs. PL/pgSQL rather than SQL, because it keeps the statement's plan for the
-- session: every submit calls it.
CREATE FUNCTION active_jobs(p_organization_id uuid, p_kind text)
RETURNS bigint LANGUAGE plpgsql STABLE SET search_path = public, pg_temp AS $$
BEGIN
    RETURN (SELECT coalesce(sum(c.active), 0) FROM active_job_counts c
            WHERE c.organization_id = p_organization_id AND (p_kind IS NULL OR c.kind = p_kind));
END $$;

CREATE OR REPLACE FUNCTION quota_refusal(p_organization_id uuid, p_kinds text[], p_kind_caps integer[],
                              p_org_cap integer, margin integer)
RETURNS TABLE (refused_kind text, cap integer)
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
DECLARE
    wanted record;
BEGIN
    FOR wanted IN
        -- the organization first, then each kind of the batch once
        SELECT '' AS kind, cardinality(p_kinds) AS n,
               coalesce((SELECT q.max_active FROM job_quotas q
                         WHERE q.organization_id = p_organization_id AND q.kind = ''),
                        p_org_cap) AS cap, 0 AS ord
        UNION ALL
        SELECT k.kind, count(*)::integer,
               coalesce(max(q.max_active), max(k.cap)), 1
        FROM unnest(p_kinds, p_kind_caps) AS k (kind, cap)
        LEFT JOIN job_quotas q ON q.organization_id = p_organization_id AND q.kind = k.kind
        GROUP BY k.kind
        ORDER BY ord, kind
    LOOP
        CONTINUE WHEN wanted.cap IS NULL;
        IF active_jobs(p_organization_id, nullif(wanted.kind, '')) + wanted.n + margin
           > wanted.cap THEN
            RETURN QUERY SELECT wanted.kind, wanted.cap;
            RETURN;
        END IF;
    END LOOP;
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
    FROM new_jobs n WHERE n.status IN ('queued', 'leased', 'cancel_requested');
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
          WHERE o.status IN ('queued', 'leased', 'cancel_requested')
          UNION ALL
          SELECT n.organization_id, n.kind, 1 FROM new_jobs n
          WHERE n.status IN ('queued', 'leased', 'cancel_requested')) AS c;

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
    FROM gone_jobs g WHERE g.status IN ('queued', 'leased', 'cancel_requested');
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION jobs_after_truncate() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    TRUNCATE job_events;
    TRUNCATE active_job_counts;
    RETURN NULL;
END $$;

DROP INDEX jobs_active_org_kind_idx;

REVOKE ALL ON FUNCTION active_jobs(uuid, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION add_active_jobs(uuid[], text[], integer[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION recount_active_jobs() FROM PUBLIC;

-- The jobs already there.
SELECT recount_active_jobs();
