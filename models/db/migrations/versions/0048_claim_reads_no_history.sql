-- Revision 0048: the claim does not walk history (issue 32).
--
-- Behind a transaction left open (a REPEATABLE READ report), vacuum removes no index entry of a
-- job that finished since it began, and claim_jobs(), which read its indexes from their
-- beginning, fetched every such job to learn it was gone: 162,240 buffers a claim instead of
-- 2,507, p95 8.8 times longer at 100 jobs a second. Each (organization, priority) key now has
-- a head in claim_heads, where its queued jobs begin, and the claim reads from there: the ring
-- of organizations from claim_heads, each priority's jobs from its head on. Beat's claim_heads
-- chore moves the heads forward (advance_claim_heads()); the jobs triggers move them back when
-- a job becomes claimable behind one (lower_claim_heads()). Running jobs are counted only when
-- organizations compete, from now on in jobs_org_running_idx. And the claim no longer takes
-- jobs whose lease ran out itself (its scan of jobs_lease_expiry_idx walked every lease ever
-- ended): beat's expired_leases chore puts them back in the queue, and a claim takes them there.

-- Where each organization's queued jobs begin, so that a claim starts there instead of walking
-- the index from its beginning. jobs_fair_claim_idx keeps an entry for every job that was ever
-- queued until vacuum removes it, and vacuum removes none that a transaction still open may
-- see: behind a REPEATABLE READ report left open for ten minutes, every job finished in those
-- ten minutes lies at the start of its organization's range, and a claim that reads from the
-- start fetches each of them from the heap to learn it is gone (issue 32: 162,240 buffers a
-- claim instead of 2,507).
--
-- One head per (organization, priority) key that had claimable jobs: a position in the claim's
-- order within the key, (run_after, created_at), below which no queued job of the key remains.
-- The claim scans each key from its head. A head may lag behind the first queued job (the
-- claim then reads a few entries more); it is never ahead of one (the claim would not see
-- it): the jobs triggers move a head back before the job they make claimable commits
-- (lower_claim_heads()), and only advance_claim_heads() moves heads forward.
--
-- A key's head is its row of the highest version. A move writes a new version, never an
-- UPDATE: under an open transaction an updated row keeps every old version in its chain, and
-- the claim, which reads the heads, would walk them all. The versions a newer one superseded
-- are deleted by advance_claim_heads(); the newest is the first entry of the key in
-- claim_heads_newest_idx, whatever dead versions follow it. No foreign key to organizations:
-- a head outlives nothing it matters for (the claim joins organizations, and a key with no
-- queued job is dropped after a while), and a check per submit would cost an index probe.
CREATE SEQUENCE claim_head_versions;
CREATE TABLE claim_heads (
    organization_id uuid NOT NULL,
    priority        smallint NOT NULL,
    version         bigint NOT NULL DEFAULT nextval('claim_head_versions'),
    run_after       timestamptz NOT NULL,
    created_at      timestamptz NOT NULL,
    -- The last time the key was seen with work: a key idle for long is dropped.
    busy_at         timestamptz NOT NULL DEFAULT now()
);
ALTER SEQUENCE claim_head_versions OWNED BY claim_heads.version;
CREATE INDEX claim_heads_newest_idx ON claim_heads (organization_id, priority DESC, version DESC);

-- claim_heads: the owner's alone (the claim, the jobs triggers and advance_claim_heads() read
-- and write it as the owner).
ALTER TABLE claim_heads ENABLE ROW LEVEL SECURITY;
ALTER TABLE claim_heads FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON claim_heads TO space_owner USING (true) WITH CHECK (true);

-- Jobs that just became claimable (submitted, put back in the queue, moved in it), one array
-- element each: their keys' heads move back to their positions where they were further on, and
-- a key with no head gets one. Called by the jobs triggers, before the jobs' transaction
-- commits.
--
-- Why a head is never ahead of a claimable job. The lock taken here (shared: the triggers do
-- not wait for each other) is the one advance_claim_heads() takes exclusively, and only tries
-- to: while this transaction is open, no head moves forward; and a head moved forward before
-- this lock was granted is read below in a snapshot taken after it, so a position further on
-- than the job's is seen, and lowered. After this commit the job is visible to the next
-- advance, which stops at it. A transaction that reads one snapshot for all its statements
-- (REPEATABLE READ, SERIALIZABLE) may not see the newest head: its keys' heads go back to the
-- start, and the next advance moves them on.
CREATE FUNCTION lower_claim_heads(p_orgs uuid[], p_priorities smallint[],
                                  p_run_after timestamptz[], p_created_at timestamptz[])
RETURNS void
LANGUAGE plpgsql SET search_path = public, pg_temp
-- One index probe a key, whatever the calling trigger turned off.
SET enable_nestloop = on AS $$
DECLARE
    fresh_snapshot CONSTANT boolean := current_setting('transaction_isolation') = 'read committed';
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext('spacejobs.claim_heads'));
    INSERT INTO claim_heads (organization_id, priority, run_after, created_at)
    SELECT c.org, c.priority,
           CASE WHEN fresh_snapshot THEN c.run_after ELSE '-infinity' END,
           CASE WHEN fresh_snapshot THEN c.created_at ELSE '-infinity' END
    FROM (SELECT DISTINCT ON (j.org, j.priority) j.org, j.priority, j.run_after, j.created_at
          FROM unnest(p_orgs, p_priorities, p_run_after, p_created_at)
              AS j (org, priority, run_after, created_at)
          ORDER BY j.org, j.priority, j.run_after, j.created_at) AS c
    LEFT JOIN LATERAL (
        SELECT h.run_after, h.created_at FROM claim_heads h
        WHERE h.organization_id = c.org AND h.priority = c.priority
        ORDER BY h.priority DESC, h.version DESC
        LIMIT 1
    ) AS h ON true
    WHERE h.run_after IS NULL OR NOT fresh_snapshot
       OR (c.run_after, c.created_at) < (h.run_after, h.created_at);
END $$;
REVOKE ALL ON FUNCTION lower_claim_heads(uuid[], smallint[], timestamptz[], timestamptz[])
    FROM PUBLIC;

-- Now with lease_until after the organization, for the running count below.
DROP INDEX jobs_org_running_idx;
-- claim_jobs: how many jobs an organization runs now (its fair share by time), read from now on:
-- the entries of leases that ended before now (finished jobs' among them, until vacuum may
-- remove them) come first, and are not walked.
CREATE INDEX jobs_org_running_idx ON jobs (organization_id, lease_until)
    WHERE status IN ('leased', 'cancel_requested');

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
    -- Jobs born queued: no head of their keys is further on than they are.
    PERFORM lower_claim_heads(array_agg(n.organization_id), array_agg(n.priority),
                              array_agg(n.run_after), array_agg(n.created_at))
    FROM new_jobs n WHERE n.status = 'queued' HAVING count(*) > 0;
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

CREATE OR REPLACE FUNCTION jobs_after_truncate() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    TRUNCATE job_events;
    TRUNCATE job_reservations;
    TRUNCATE active_job_counts;
    TRUNCATE claim_heads;
    RETURN NULL;
END $$;

-- The claim's ring: the organizations with a head (claim_heads), from just after p_after round
-- to it again, at most p_visit of them, with their places in that order (place). A loose index scan of
-- claim_heads_newest_idx, one probe per organization: it never reads jobs, whose indexes keep
-- the entries of every finished job an open transaction may still see.
CREATE FUNCTION claim_ring(p_after uuid, p_visit integer)
RETURNS TABLE (org uuid, place integer)
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE after_cursor (org, n) AS (
        SELECT (SELECT h.organization_id FROM claim_heads h
                WHERE h.organization_id > p_after
                ORDER BY h.organization_id LIMIT 1), 1
        UNION ALL
        SELECT (SELECT h.organization_id FROM claim_heads h
                WHERE h.organization_id > a.org
                ORDER BY h.organization_id LIMIT 1), a.n + 1
        FROM after_cursor a WHERE a.org IS NOT NULL AND a.n < p_visit
    ), from_start (org, n) AS (
        SELECT (SELECT h.organization_id FROM claim_heads h
                ORDER BY h.organization_id LIMIT 1), 1
        UNION ALL
        SELECT (SELECT h.organization_id FROM claim_heads h
                WHERE h.organization_id > f.org
                ORDER BY h.organization_id LIMIT 1), f.n + 1
        FROM from_start f WHERE f.org IS NOT NULL AND f.org < p_after AND f.n < p_visit
    )
    SELECT r.org, r.place FROM (
        SELECT a.org, a.n AS place FROM after_cursor a WHERE a.org IS NOT NULL
        UNION ALL
        SELECT f.org, p_visit + f.n FROM from_start f
        WHERE f.org IS NOT NULL AND f.org <= p_after
    ) AS r
    ORDER BY r.place
    LIMIT p_visit
$$;
REVOKE ALL ON FUNCTION claim_ring(uuid, integer) FROM PUBLIC;

-- An organization's keys with their heads: each priority it has a head for, highest first, and
-- that head (the key's newest version). A loose index scan of claim_heads_newest_idx, and one
-- probe per key whose first entry is the newest version. SQL, so that the claim plans it in
-- place (inlined).
CREATE FUNCTION claim_levels(p_org uuid)
RETURNS TABLE (priority smallint, run_after timestamptz, created_at timestamptz)
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE levels (priority) AS (
        SELECT (SELECT h.priority FROM claim_heads h WHERE h.organization_id = p_org
                ORDER BY h.priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT h.priority FROM claim_heads h
                WHERE h.organization_id = p_org AND h.priority < l.priority
                ORDER BY h.priority DESC LIMIT 1)
        FROM levels l WHERE l.priority IS NOT NULL
    )
    SELECT l.priority, n.run_after, n.created_at
    FROM levels l CROSS JOIN LATERAL (
        SELECT h.run_after, h.created_at FROM claim_heads h
        WHERE h.organization_id = p_org AND h.priority = l.priority
        ORDER BY h.priority DESC, h.version DESC
        LIMIT 1
    ) AS n
    WHERE l.priority IS NOT NULL
    ORDER BY l.priority DESC
$$;
REVOKE ALL ON FUNCTION claim_levels(uuid) FROM PUBLIC;

-- Heads forward (beat's claim_heads chore, every second): each key's head moves to its first
-- queued job, but no further than p_lag ago, so that the jobs a claim reads past are only
-- those of the last p_lag; the versions the new ones supersede are deleted; a key with no
-- queued job left and no work seen for p_idle is dropped (the jobs triggers make it again).
-- A key that had work since the last run (a queued job, or a job of its organization made
-- since) is marked busy now, even if its queue drained in between.
--
-- Only while no transaction that made jobs claimable is open (the lock lower_claim_heads()
-- takes shared): every such job is then committed and seen here. Else nothing moves this time:
-- a head may lag, never skip a claimable job. Returns how many heads moved, NULL when it could
-- not look.
CREATE FUNCTION advance_claim_heads(p_lag interval, p_idle interval) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
SET enable_seqscan = off AS $$
DECLARE
    moved integer;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('spacejobs.claim_heads')) THEN
        RETURN NULL;
    END IF;
    -- Read after the lock: a snapshot in which every job made claimable so far is committed.
    WITH heads AS (
        SELECT DISTINCT ON (h.organization_id, h.priority)
               h.organization_id, h.priority, h.run_after, h.created_at, h.busy_at
        FROM claim_heads h
        ORDER BY h.organization_id, h.priority DESC, h.version DESC
    ), looked AS (
        SELECT h.*, f.run_after AS first_run_after, f.created_at AS first_created_at,
               f.run_after IS NOT NULL OR EXISTS (
                   SELECT 1 FROM jobs n
                   WHERE n.organization_id = h.organization_id AND n.created_at > h.busy_at)
                   AS busy
        FROM heads h LEFT JOIN LATERAL (
            SELECT q.run_after, q.created_at FROM jobs q
            WHERE q.organization_id = h.organization_id AND q.priority = h.priority
              AND q.status = 'queued'
              AND (q.run_after, q.created_at) >= (h.run_after, h.created_at)
            ORDER BY q.priority DESC, q.run_after, q.created_at
            LIMIT 1
        ) AS f ON true
    ), targets AS (
        -- Where each head goes: its first queued job, or p_lag ago if that is sooner (or the
        -- key has no queued job).
        SELECT l.*, l.first_run_after IS NULL AS empty,
               CASE WHEN (l.first_run_after, l.first_created_at)
                         < (now() - p_lag, '-infinity'::timestamptz)
                    THEN l.first_run_after ELSE now() - p_lag END AS to_run_after,
               CASE WHEN (l.first_run_after, l.first_created_at)
                         < (now() - p_lag, '-infinity'::timestamptz)
                    THEN l.first_created_at ELSE '-infinity' END AS to_created_at
        FROM looked l
    ), moves AS (
        SELECT t.*, (t.to_run_after, t.to_created_at) > (t.run_after, t.created_at) AS forward,
               t.empty AND NOT t.busy AND t.busy_at < now() - p_idle AS idle
        FROM targets t
    ), dropped AS (
        DELETE FROM claim_heads h USING moves m
        WHERE h.organization_id = m.organization_id AND h.priority = m.priority AND m.idle
    )
    INSERT INTO claim_heads (organization_id, priority, run_after, created_at, busy_at)
    SELECT m.organization_id, m.priority,
           CASE WHEN m.forward THEN m.to_run_after ELSE m.run_after END,
           CASE WHEN m.forward THEN m.to_created_at ELSE m.created_at END,
           CASE WHEN m.busy THEN now() ELSE m.busy_at END
    FROM moves m
    WHERE NOT m.idle AND (m.forward OR (m.busy AND m.busy_at < now() - p_idle / 2));
    GET DIAGNOSTICS moved = ROW_COUNT;
    -- The versions superseded (this run's, or a job's that lowered a head before it).
    DELETE FROM claim_heads h
    WHERE EXISTS (SELECT 1 FROM claim_heads n
                  WHERE n.organization_id = h.organization_id AND n.priority = h.priority
                    AND n.version > h.version);
    RETURN moved;
END $$;
REVOKE ALL ON FUNCTION advance_claim_heads(interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION advance_claim_heads(interval, interval) TO space_worker;

CREATE OR REPLACE FUNCTION claim_jobs(p_worker text, p_limit integer, p_skip_kinds text[], p_only_kind text,
                           p_after_organization uuid, p_rate_kinds text[] DEFAULT '{}',
                           p_rate_max integer[] DEFAULT '{}',
                           p_rate_seconds integer[] DEFAULT '{}')
RETURNS TABLE (id uuid, organization_id uuid, requested_by uuid, kind text, params jsonb,
               attempts integer, max_attempts integer, lease_token uuid, lease_seconds integer,
               request_id text, more_due boolean, window_opens_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
-- JIT compiled this short statement on every call once the queue was large (revision 0016).
-- Every read below has an index made for it, so no sequential or bitmap scan, and a plan of
-- those indexes does not depend on the statistics: one generic plan a session. Without this a
-- claim behind 1,000,000 finished rows took 80 ms instead of 1 (revision 0023).
SET jit = off SET enable_seqscan = off SET enable_bitmapscan = off
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    nil CONSTANT uuid := '00000000-0000-0000-0000-000000000000';
    -- The ring's organizations a claim looks at, at most: those with a head, which are those
    -- with work now or within advance_claim_heads()' idle time.
    ring_visit CONSTANT integer := 1024;
    limited text[];
    limited_kind text;
    org uuid;
    wrapped boolean;
    max_starts integer;
    per_seconds integer;
    recent timestamptz[];
    checked_at timestamptz;
    started integer;
    oldest timestamptz;
    locked boolean;
    room integer;
    got integer;
    taken integer := 0;
    next_window timestamptz;
BEGIN
    -- The rate-limited kinds this claim may take: declared by a kind, or limited by an operator
    -- for some organization (its other organizations' jobs of that kind are left to the fair
    -- claim below).
    limited := ARRAY(SELECT DISTINCT l.k FROM (SELECT unnest(p_rate_kinds)
                                               UNION SELECT r.kind FROM job_rate_limits r) AS l (k)
                     WHERE l.k <> ALL (p_skip_kinds) AND (p_only_kind IS NULL OR l.k = p_only_kind)
                     ORDER BY l.k);
    FOREACH limited_kind IN ARRAY limited LOOP
        EXIT WHEN taken >= p_limit;
        -- The kind's organizations with queued jobs, from just after p_after_organization round
        -- to it again: one probe of jobs_kind_claim_idx each.
        org := p_after_organization;
        wrapped := false;
        LOOP
            EXIT WHEN taken >= p_limit;
            SELECT q.organization_id INTO org FROM jobs q
            WHERE q.status = 'queued' AND q.kind = limited_kind AND q.organization_id > org
            ORDER BY q.kind, q.organization_id LIMIT 1;
            IF NOT FOUND OR (wrapped AND org > p_after_organization) THEN
                EXIT WHEN wrapped;
                wrapped := true;
                org := nil;
                CONTINUE;
            END IF;
            -- The limit: the operators' for this organization, else the kind's own, else none.
            SELECT r.max_starts, r.per_seconds INTO max_starts, per_seconds
            FROM job_rate_limits r WHERE r.organization_id = org AND r.kind = limited_kind;
            IF NOT FOUND THEN
                SELECT d.m, d.s INTO max_starts, per_seconds
                FROM unnest(p_rate_kinds, p_rate_max, p_rate_seconds) AS d (k, m, s)
                WHERE d.k = limited_kind;
            END IF;
            CONTINUE WHEN max_starts IS NULL;  -- not limited here: the fair claim below takes it
            room := p_limit - taken;
            -- The window is read twice: first without a lock (a window full in this snapshot
            -- is full now: its row only gains starts, and those it drops have left every later
            -- window too, so the claimers of a full window pass by without writing a row lock
            -- each), then under its row's lock, which is what makes the count exact.
            SELECT w.starts INTO recent FROM rate_limit_windows w
            WHERE w.organization_id = org AND w.kind = limited_kind;
            locked := false;
            LOOP
                -- After the lock, every start another claimer recorded has committed.
                checked_at := clock_timestamp();
                SELECT count(*)::integer, min(s.at) INTO started, oldest
                FROM unnest(recent) AS s (at)
                WHERE s.at > checked_at - per_seconds * interval '1 second';
                IF started >= max_starts THEN
                    -- Full: the window lets one more start when its oldest start leaves it.
                    -- The caller wakes a claimer then (a wake-up with a countdown).
                    next_window := least(next_window, oldest + per_seconds * interval '1 second');
                    EXIT;
                END IF;
                EXIT WHEN locked;
                SELECT w.starts INTO recent FROM rate_limit_windows w
                WHERE w.organization_id = org AND w.kind = limited_kind FOR UPDATE SKIP LOCKED;
                IF NOT FOUND THEN
                    -- No row yet (the pair's first start), or another claimer holds it.
                    INSERT INTO rate_limit_windows (organization_id, kind)
                    VALUES (org, limited_kind) ON CONFLICT DO NOTHING;
                    SELECT w.starts INTO recent FROM rate_limit_windows w
                    WHERE w.organization_id = org AND w.kind = limited_kind
                    FOR UPDATE SKIP LOCKED;
                    EXIT WHEN NOT FOUND;  -- that claimer serves the pair
                END IF;
                locked := true;
            END LOOP;
            CONTINUE WHEN NOT locked OR started >= max_starts;
            room := least(room, max_starts - started);
            CONTINUE WHEN room <= 0;
            RETURN QUERY
            WITH picked AS (
                SELECT q.ctid FROM jobs q
                WHERE q.kind = limited_kind AND q.organization_id = org AND q.status = 'queued'
                  AND q.run_after <= now()
                  AND (q.sequence_key IS NULL OR NOT EXISTS (
                      SELECT 1 FROM jobs p
                      WHERE p.organization_id = q.organization_id
                        AND p.sequence_key = q.sequence_key
                        AND p.sequence_position < q.sequence_position
                        AND p.status IN ('queued', 'leased', 'cancel_requested', 'waiting')))
                ORDER BY q.kind, q.organization_id, q.priority DESC, q.run_after, q.created_at
                LIMIT room
                FOR UPDATE OF q SKIP LOCKED
            )
            UPDATE jobs j
            SET status = 'leased', lease_token = gen_random_uuid(), leased_by = p_worker,
                lease_until = clock_timestamp() + j.lease_seconds * interval '1 second',
                attempts = j.attempts + 1, started_at = coalesce(j.started_at, now())
            WHERE j.ctid = ANY (ARRAY(SELECT picked.ctid FROM picked))
            RETURNING j.id, j.organization_id, j.requested_by, j.kind, j.params, j.attempts,
                      j.max_attempts, j.lease_token, j.lease_seconds, j.request_id, false,
                      NULL::timestamptz;
            GET DIAGNOSTICS got = ROW_COUNT;
            taken := taken + got;
            IF got > 0 THEN
                -- Stamped after the leases (so no earlier than any of them, their events
                -- included); only the window's worth, at most the limit, is kept.
                UPDATE rate_limit_windows w
                SET starts = ARRAY(SELECT s.at FROM unnest(w.starts || array_fill(
                                       clock_timestamp(), ARRAY[got])) AS s (at)
                                   WHERE s.at > clock_timestamp() - per_seconds * interval '1 second'
                                   ORDER BY s.at DESC LIMIT max_starts)
                WHERE w.organization_id = org AND w.kind = limited_kind;
            END IF;
        END LOOP;
    END LOOP;
    IF next_window IS NOT NULL THEN
        -- One row with no job: when a full window next lets a job start.
        RETURN QUERY SELECT NULL::uuid, NULL::uuid, NULL::uuid, NULL::text, NULL::jsonb,
                            NULL::integer, NULL::integer, NULL::uuid, NULL::integer, NULL::text,
                            false, next_window;
    END IF;
    IF taken >= p_limit THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH open_orgs AS (
        -- The ring's organizations with a job this claim may take (claim_ring(): those with a
        -- head, from just after p_after_organization round to it again), at most
        -- greatest(p_limit, 32) of them even for a small batch, so that concurrent claimers
        -- whose first organizations' jobs are locked by each other (SKIP LOCKED) still find
        -- the next ones'. One whose queued jobs are all held back (a full rate limit, a
        -- sequence, a later start) takes no share, else its empty share would leave the
        -- others' jobs for another claim. No lock here (the share below locks).
        SELECT r.org, r.place AS position, o.claim_weight AS weight, l.rate_limited
        FROM claim_ring(p_after_organization, ring_visit) r
        JOIN organizations o ON o.id = r.org
        CROSS JOIN LATERAL (
            SELECT p_rate_kinds || ARRAY(SELECT k.kind FROM job_rate_limits k
                                         WHERE k.organization_id = r.org) AS rate_limited
        ) AS l
        -- The same filter as `queued` below: a job it finds is one that may take a slot.
        -- A scalar sub-select with LIMIT 1, not EXISTS: EXISTS became a join with every
        -- queued job of the ring.
        WHERE (SELECT true FROM claim_levels(r.org) h CROSS JOIN LATERAL (
                   SELECT 1 FROM jobs q
                   WHERE q.organization_id = r.org AND q.priority = h.priority
                     AND q.status = 'queued'
                     AND (q.run_after, q.created_at) >= (h.run_after, h.created_at)
                     AND q.run_after <= now()
                     AND NOT coalesce(q.kind = ANY (p_skip_kinds), false)
                     AND NOT coalesce(q.kind = ANY (l.rate_limited), false)
                     AND (p_only_kind IS NULL OR q.kind = p_only_kind)
                     AND (q.sequence_key IS NULL OR NOT EXISTS (
                          SELECT 1 FROM jobs p
                          WHERE p.organization_id = q.organization_id
                            AND p.sequence_key = q.sequence_key
                            AND p.sequence_position < q.sequence_position
                            AND p.status IN ('queued', 'leased', 'cancel_requested', 'waiting')))
                   ORDER BY q.priority DESC, q.run_after, q.created_at
                   LIMIT 1) AS x
               LIMIT 1)
        ORDER BY r.place
        LIMIT greatest(p_limit, 32)
    ), shares AS (
        -- Each open organization's share of the batch, in proportion to its weight (at least
        -- one), and the jobs it runs now, counted only when organizations compete for the
        -- batch (alone, an organization takes it whatever it runs): its leases still running,
        -- read from jobs_org_running_idx from now on, so that the entries of leases that ended
        -- before now, which vacuum may not have removed yet, are not walked.
        SELECT o.org, o.position, o.weight, o.rate_limited,
               ceil((p_limit - taken) * o.weight::numeric / sum(o.weight) OVER ())::integer
                   AS share,
               CASE WHEN count(*) OVER () > 1 THEN
                   (SELECT count(*) FROM jobs b
                    WHERE b.organization_id = o.org AND b.status IN ('leased', 'cancel_requested')
                      AND b.lease_until > now())
               ELSE 0 END AS running
        FROM open_orgs o
    ), queued AS (
        -- Each organization's share, priority by priority (claim_levels(), highest first),
        -- each priority's jobs read from its head on in the order of jobs_fair_claim_idx
        -- (ordered by priority too, though it is one: else jobs_claimable_idx, whose order is
        -- (run_after, created_at), may look cheaper to a generic plan, and it reads every
        -- organization's jobs).
        SELECT s.position, s.weight, s.running, c.ctid, c.priority, c.run_after, c.created_at
        FROM shares s CROSS JOIN LATERAL (
            SELECT f.ctid, f.priority, f.run_after, f.created_at
            FROM claim_levels(s.org) h CROSS JOIN LATERAL (
                SELECT q.ctid, q.priority, q.run_after, q.created_at FROM jobs q
                WHERE q.organization_id = s.org AND q.priority = h.priority
                  AND q.status = 'queued'
                  AND (q.run_after, q.created_at) >= (h.run_after, h.created_at)
                  AND q.run_after <= now()
                  -- "not among", written so that the generic plan cannot take it for a filter
                  -- that drops every row (`kind <> ALL` with one kind in the statistics did):
                  -- it then read the whole organization through jobs_kind_claim_idx and
                  -- sorted it, instead of the first jobs of jobs_fair_claim_idx in order.
                  AND NOT coalesce(q.kind = ANY (p_skip_kinds), false)
                  AND NOT coalesce(q.kind = ANY (s.rate_limited), false)
                  AND (p_only_kind IS NULL OR q.kind = p_only_kind)
                  AND (q.sequence_key IS NULL OR NOT EXISTS (
                          SELECT 1 FROM jobs p
                          WHERE p.organization_id = q.organization_id
                            AND p.sequence_key = q.sequence_key
                            AND p.sequence_position < q.sequence_position
                            AND p.status IN ('queued', 'leased', 'cancel_requested', 'waiting')))
                ORDER BY q.priority DESC, q.run_after, q.created_at
                LIMIT s.share
                FOR UPDATE OF q SKIP LOCKED
            ) AS f
            LIMIT s.share
        ) AS c
    ), interleaved AS (
        -- Slot by slot, each to the organization that would then run the fewest jobs per unit
        -- of weight; on a tie, to the one that runs fewer per unit of weight now (else an
        -- organization whose short jobs end often would meet every tie, and lose it), then
        -- the ring's order.
        SELECT i.ctid FROM (
            SELECT q.ctid, q.position, q.running::numeric / q.weight AS load,
                   (q.running + row_number() OVER (PARTITION BY q.position
                                                   ORDER BY q.priority DESC, q.run_after,
                                                            q.created_at))
                       ::numeric / q.weight AS round
            FROM queued q
        ) AS i
        ORDER BY i.round, i.load, i.position
        LIMIT p_limit - taken
    )
    UPDATE jobs j
    SET status = 'leased', lease_token = gen_random_uuid(), leased_by = p_worker,
        lease_until = clock_timestamp() + j.lease_seconds * interval '1 second',
        attempts = j.attempts + 1, started_at = coalesce(j.started_at, now())
    -- By the row versions the CTEs locked (FOR UPDATE: nobody else can move them before this
    -- UPDATE), a TID scan: no second probe of jobs_pkey per job (revision 0017).
    WHERE j.ctid = ANY (ARRAY(SELECT interleaved.ctid FROM interleaved))
    RETURNING j.id, j.organization_id, j.requested_by, j.kind, j.params, j.attempts,
              j.max_attempts, j.lease_token, j.lease_seconds, j.request_id,
              -- whether more was due than this claim took (as of its start): the claimer then
              -- tells another process, since wake-ups are coalesced. Counted from the heads.
              (SELECT count(*) > p_limit FROM (
                  SELECT 1 FROM claim_ring(nil, ring_visit) r
                  CROSS JOIN LATERAL claim_levels(r.org) h
                  CROSS JOIN LATERAL (
                      SELECT 1 FROM jobs m
                      WHERE m.organization_id = r.org AND m.priority = h.priority
                        AND m.status = 'queued'
                        AND (m.run_after, m.created_at) >= (h.run_after, h.created_at)
                        AND m.run_after <= now()
                      ORDER BY m.priority DESC, m.run_after, m.created_at
                      LIMIT p_limit + 1) AS d
                  LIMIT p_limit + 1) AS due),
              NULL::timestamptz;
    GET DIAGNOSTICS got = ROW_COUNT;
    IF got = 0 AND taken = 0 THEN
        -- Nothing taken: one row with no job says whether jobs were due all the same (locked
        -- by concurrent claimers for a moment), so the caller may try again instead of idling.
        -- Jobs held back by a rate limit or a sequence are not: they are not claimable yet.
        RETURN QUERY SELECT NULL::uuid, NULL::uuid, NULL::uuid, NULL::text, NULL::jsonb,
                            NULL::integer, NULL::integer, NULL::uuid, NULL::integer, NULL::text,
                            EXISTS (
                                SELECT 1 FROM claim_ring(nil, ring_visit) r
                                CROSS JOIN LATERAL claim_levels(r.org) h
                                CROSS JOIN LATERAL (
                                    SELECT 1 FROM jobs m
                                    WHERE m.organization_id = r.org AND m.priority = h.priority
                                      AND m.status = 'queued'
                                      AND (m.run_after, m.created_at)
                                          >= (h.run_after, h.created_at)
                                      AND m.run_after <= now()
                                      AND m.kind <> ALL (p_skip_kinds)
                                      AND m.kind <> ALL (p_rate_kinds)
                                      AND NOT EXISTS (
                                          SELECT 1 FROM job_rate_limits l
                                          WHERE l.organization_id = m.organization_id
                                            AND l.kind = m.kind)
                                      AND (p_only_kind IS NULL OR m.kind = p_only_kind)
                                      AND (m.sequence_key IS NULL OR NOT EXISTS (
                      SELECT 1 FROM jobs p
                      WHERE p.organization_id = m.organization_id
                        AND p.sequence_key = m.sequence_key
                        AND p.sequence_position < m.sequence_position
                        AND p.status IN ('queued', 'leased', 'cancel_requested', 'waiting')))
                                    ORDER BY m.priority DESC, m.run_after, m.created_at
                                    LIMIT 1) AS d),
                            next_window;
    END IF;
END $$;

-- The heads of the jobs queued now: each key's first job.
INSERT INTO claim_heads (organization_id, priority, run_after, created_at)
SELECT DISTINCT ON (j.organization_id, j.priority) j.organization_id, j.priority, j.run_after,
       j.created_at
FROM jobs j WHERE j.status = 'queued'
ORDER BY j.organization_id, j.priority DESC, j.run_after, j.created_at;
