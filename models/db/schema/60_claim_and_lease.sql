-- The worker's side of a lease: the claim that takes jobs, and the requester's standing read
-- before a fenced write. The fenced statements themselves are in models/jobs/store.sql.

-- The requester's standing for jobs the caller holds the lease of: the membership role and the
-- organization's state, read as the owner (the worker role may not read memberships across
-- organizations) and only for rows whose lease token the caller presents. FOR SHARE holds the
-- membership and the organization still until the caller commits: a removal or a state change
-- waits for the job's write to commit, instead of slipping in between the check and the write.
-- A job missing from the result has no membership left (or the lease is no longer the caller's;
-- the fenced write that follows tells those apart).
-- Each (organization, requester) pair is locked once, however many of its jobs are in the batch.
CREATE FUNCTION lease_standing(p_ids uuid[], p_tokens uuid[])
RETURNS TABLE (job_id uuid, role text, organization_state text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    -- PL/pgSQL for its plan, kept for the session (see api_principal(), revision 0036). The
    -- held jobs are found one primary-key probe per lease given: with a filter on the ids as
    -- well, the plan joined the leases to the rows by nested loop, each row against every
    -- lease, and a batch's cost grew with its square (revision 0063).
    RETURN QUERY
    WITH held AS (
        SELECT j.id, j.organization_id, j.requested_by
        FROM unnest(p_ids, p_tokens) AS l (id, token)
        JOIN jobs j ON j.id = l.id AND j.lease_token = l.token
                   AND j.status IN ('leased', 'cancel_requested')
    ), standing AS (
        SELECT m.organization_id, m.user_id, m.role, o.state
        FROM memberships m JOIN organizations o ON o.id = m.organization_id
        WHERE (m.organization_id, m.user_id) IN (SELECT h.organization_id, h.requested_by
                                                 FROM held h)
        FOR SHARE OF m, o
    )
    SELECT h.id, s.role, s.state
    FROM held h
    JOIN standing s ON s.organization_id = h.organization_id AND s.user_id = h.requested_by;
END $$;
REVOKE ALL ON FUNCTION lease_standing(uuid[], uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lease_standing(uuid[], uuid[]) TO space_worker;

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
-- A run visits at most p_orgs organizations, every key of each, round the claim's ring from
-- just after p_after (NULL: from the start), and answers the last one it visited, where the
-- next run goes on: its exclusive lock, which every submit of a claimable job waits for, is
-- held for a slice of the keys, never for all of them however many organizations there are.
-- Each key is found by one probe of claim_heads_newest_idx (claim_ring(), claim_levels()),
-- not by a walk of the versions that a long-open transaction keeps.
--
-- Only while no transaction that made jobs claimable is open (the lock lower_claim_heads()
-- takes shared): every such job is then committed and seen here. Else nothing moves this time:
-- a head may lag, never skip a claimable job. moved is how many heads moved, NULL when it could
-- not look (last_org is then p_after). No JIT: the planner guesses a hundred keys an
-- organization, the cost passes jit_above_cost, and LLVM compiled the move for 340 ms of a
-- 385 ms run (bench/claim_heads.sql, auto_explain).
CREATE FUNCTION advance_claim_heads(p_lag interval, p_idle interval, p_after uuid,
                                    p_orgs integer)
RETURNS TABLE (moved integer, last_org uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
SET enable_seqscan = off SET jit = off AS $$
DECLARE
    slice uuid[];
    count_moved integer;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('spacejobs.claim_heads')) THEN
        RETURN QUERY SELECT NULL::integer, p_after;
        RETURN;
    END IF;
    -- Read after the lock: a snapshot in which every job made claimable so far is committed.
    SELECT array_agg(r.org ORDER BY r.place) INTO slice
    FROM claim_ring(coalesce(p_after, '00000000-0000-0000-0000-000000000000'),
                    greatest(p_orgs, 1)) AS r;
    IF slice IS NULL THEN
        RETURN QUERY SELECT 0, NULL::uuid;
        RETURN;
    END IF;
    WITH heads AS (
        SELECT o.org AS organization_id, l.priority, l.run_after, l.created_at, b.busy_at
        FROM unnest(slice) AS o (org)
        CROSS JOIN LATERAL claim_levels(o.org) AS l
        CROSS JOIN LATERAL (
            SELECT h.busy_at FROM claim_heads h
            WHERE h.organization_id = o.org AND h.priority = l.priority
            ORDER BY h.priority DESC, h.version DESC
            LIMIT 1
        ) AS b
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
    GET DIAGNOSTICS count_moved = ROW_COUNT;
    -- The versions superseded in the slice (this run's, or a job's that lowered a head before
    -- it).
    DELETE FROM claim_heads h
    WHERE h.organization_id = ANY (slice)
      AND EXISTS (SELECT 1 FROM claim_heads n
                  WHERE n.organization_id = h.organization_id AND n.priority = h.priority
                    AND n.version > h.version);
    RETURN QUERY SELECT count_moved, slice[cardinality(slice)];
END $$;
REVOKE ALL ON FUNCTION advance_claim_heads(interval, interval, uuid, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION advance_claim_heads(interval, interval, uuid, integer) TO space_worker;

-- The previous release's beat, during a rolling deploy: every organization in one run.
CREATE FUNCTION advance_claim_heads(p_lag interval, p_idle interval) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT a.moved FROM advance_claim_heads(p_lag, p_idle, NULL, 1000000000) AS a
$$;
REVOKE ALL ON FUNCTION advance_claim_heads(interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION advance_claim_heads(interval, interval) TO space_worker;

-- The claim: up to p_limit due jobs in ONE call, each with its own fresh random lease token.
--
-- First the kinds whose starts are rate limited (p_rate_kinds: the limits the caller's kinds
-- declare; job_rate_limits: the operators' per organization), organization by organization:
-- each (organization, kind) pair's window row in rate_limit_windows is locked (SKIP LOCKED:
-- another claimer serving that pair is passed by, never waited for), its recent starts
-- counted, and at most what the window leaves is leased; the new starts are recorded before
-- the lock goes with the commit. Exact across every claimer: see "Rate limits" in
-- docs/concepts/flow-control.md for why no window ever holds more than the limit.
--
-- Then everything else, fair between organizations by time: organizations are taken around a
-- ring (the caller remembers where its last claim stopped), each a share of the batch in
-- proportion to its weight, and the batch goes first to whoever runs the fewest jobs per unit
-- of weight right now (running jobs are slot-seconds accruing: counting them, not the jobs
-- started, is what makes a 2-minute report weigh more than a 50 ms export). Within an
-- organization higher priority first; a job of a sequence only once the one before it ended.
-- Every step reads an index (jobs_fair_claim_idx from each key's head, claim_heads_newest_idx,
-- jobs_kind_claim_idx, jobs_org_running_idx, jobs_sequence_idx: a job of a sequence waits while
-- an earlier place of its key is unfinished), and none from its beginning, where the entries
-- of finished jobs an open transaction may still see lie. Jobs whose lease ran out are the
-- sweeper's (sweep_expired_leases() below): back in the queue, a claim takes them. SKIP LOCKED lets concurrent
-- claimers pass each other. A function, because it is the one place a worker reads params:
-- those of the jobs it leases.
CREATE FUNCTION claim_jobs(p_worker text, p_limit integer, p_skip_kinds text[], p_only_kind text,
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
REVOKE ALL ON FUNCTION claim_jobs(text, integer, text[], text, uuid, text[], integer[], integer[])
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION claim_jobs(text, integer, text[], text, uuid, text[], integer[], integer[])
    TO space_worker;

-- The due queued jobs read as the claim reads them: each key from its claim head on, through
-- jobs_fair_claim_idx, so that what a long-open transaction keeps behind the heads is not
-- walked (every claimable job lies at or after its key's head); of the kinds p_kinds (NULL:
-- every kind), at most p_per_key of each key (NULL: all). SQL, planned in its caller's place.
CREATE FUNCTION due_from_heads(p_kinds text[], p_per_key integer)
RETURNS TABLE (kind text, run_after timestamptz, created_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT q.kind, q.run_after, q.created_at
    FROM claim_ring('00000000-0000-0000-0000-000000000000', 2147483647) AS r
    CROSS JOIN LATERAL claim_levels(r.org) AS h
    CROSS JOIN LATERAL (
        SELECT j.kind, j.run_after, j.created_at FROM jobs j
        WHERE j.organization_id = r.org AND j.priority = h.priority AND j.status = 'queued'
          AND (j.run_after, j.created_at) >= (h.run_after, h.created_at)
          AND j.run_after <= now() AND (p_kinds IS NULL OR j.kind = ANY (p_kinds))
        ORDER BY j.priority DESC, j.run_after, j.created_at
        LIMIT p_per_key
    ) AS q
$$;
REVOKE ALL ON FUNCTION due_from_heads(text[], integer) FROM PUBLIC;

-- The age /metrics shows: the earliest creation of a due queued job, per kind. Every due job is
-- read, as a scrape did before. As the owner (claim_heads is the owner's alone); kinds and
-- moments only, which the operator sees already.
CREATE FUNCTION due_queue_ages() RETURNS TABLE (kind text, oldest_created_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off AS $$
    SELECT d.kind, min(d.created_at) FROM due_from_heads(NULL, NULL) AS d GROUP BY d.kind
$$;
REVOKE ALL ON FUNCTION due_queue_ages() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION due_queue_ages() TO space_operator;

-- The moment the longest-due job of these kinds became due (NULL: none is), leaving out the
-- kinds an operator paused or limited, whose jobs may wait for a reason no worker can help: a
-- worker's liveness check. One due job of those kinds per key, its first. As the owner, as
-- above.
CREATE FUNCTION oldest_due(p_kinds text[]) RETURNS timestamptz
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off AS $$
    SELECT min(d.run_after)
    FROM (SELECT ARRAY(SELECT k.kind FROM unnest(p_kinds) AS k (kind)
                       WHERE NOT EXISTS (SELECT 1 FROM kind_settings s
                                         WHERE s.kind = k.kind
                                           AND (s.paused OR s.concurrency_limit IS NOT NULL)))
              AS kinds) AS usable
    CROSS JOIN LATERAL due_from_heads(usable.kinds, 1) AS d
$$;
REVOKE ALL ON FUNCTION oldest_due(text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION oldest_due(text[]) TO space_worker;

-- Why queued jobs have not started, each in words the pages and the JSON say (revision 0046):
-- its run_after is later (delayed until then); a job before it in its sequence has not ended
-- (the one right before it: it starts after that one); its kind's rate limit window in its
-- organization is full (until the window's oldest start leaves it, the moment claim_jobs()
-- lets one more start). The limit is the operators' for the organization (job_rate_limits),
-- else the one the kind declares, which the caller passes as claim_jobs() takes it; both
-- tables are the owner's, hence SECURITY DEFINER. The web's caller sees only the jobs of its
-- organization (app_org()), an operator any. A job that is not queued, or not visible, has no
-- row. Each job costs index probes only, never a scan of the queue: itself by its key,
-- jobs_sequence_idx backwards from its place, the limit's and the window's rows by theirs.
CREATE FUNCTION queued_jobs_held(p_jobs uuid[], p_rate_kinds text[] DEFAULT '{}',
                                 p_rate_max integer[] DEFAULT '{}',
                                 p_rate_seconds integer[] DEFAULT '{}')
RETURNS TABLE (job_id uuid, delayed_until timestamptz, behind uuid,
               rate_limited_until timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT j.id,
           CASE WHEN j.run_after > now() THEN j.run_after END,
           (SELECT p.id FROM jobs p
            WHERE j.sequence_key IS NOT NULL
              AND p.organization_id = j.organization_id AND p.sequence_key = j.sequence_key
              AND p.sequence_position < j.sequence_position
              AND p.status IN ('queued', 'leased', 'cancel_requested', 'waiting')
            ORDER BY p.sequence_position DESC LIMIT 1),
           CASE WHEN win.started >= lim.max_starts
                THEN win.oldest + lim.per_seconds * interval '1 second' END
    FROM jobs j
    LEFT JOIN LATERAL (
        SELECT coalesce(r.max_starts, d.m) AS max_starts, coalesce(r.per_seconds, d.s) AS per_seconds
        FROM (SELECT 1) AS one
        LEFT JOIN job_rate_limits r ON r.organization_id = j.organization_id AND r.kind = j.kind
        LEFT JOIN unnest(p_rate_kinds, p_rate_max, p_rate_seconds) AS d (k, m, s) ON d.k = j.kind
        LIMIT 1
    ) AS lim ON true
    LEFT JOIN LATERAL (
        SELECT count(*)::integer AS started, min(s.at) AS oldest
        FROM rate_limit_windows w, unnest(w.starts) AS s (at)
        WHERE w.organization_id = j.organization_id AND w.kind = j.kind
          AND s.at > now() - lim.per_seconds * interval '1 second'
    ) AS win ON lim.max_starts IS NOT NULL
    WHERE j.id = ANY (p_jobs) AND j.status = 'queued'
      AND (j.organization_id = app_org() OR pg_has_role(session_user, 'space_operator', 'USAGE'))
$$;
REVOKE ALL ON FUNCTION queued_jobs_held(uuid[], text[], integer[], integer[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION queued_jobs_held(uuid[], text[], integer[], integer[])
    TO space_app, space_operator;

-- =============================================================================================
-- Without the token, nothing
-- =============================================================================================
--
-- The worker role reads the queue's metadata (no params, no results, no lease tokens) and may
-- claim, sweep and resume through the functions above and in 75_waiting.sql and 80_retention.sql,
-- each bounded and doing only what the design does anyway. Everything else it does to a job, or
-- with a job's tenant data, goes through a function that takes the job's lease token and acts
-- only while that token holds the lease: it has no UPDATE on jobs, reads no token, and reaches
-- job_steps, job_signals and job_diagnostics only through these functions. A stolen worker
-- credential therefore cannot move, finish or fail a job it does not hold, nor read or forge a
-- job's steps and signals, nor read any organization's tenant data without holding a lease of
-- that organization (lease_org(), in the worker's row-level security).

-- The organization of the lease the current transaction presents: app.job_id and
-- app.lease_token, set by the worker's scope of a job it runs (models/db/transaction.py), while
-- that token holds the lease; NULL otherwise. The worker's policies on tenant tables compare
-- with it, as (SELECT lease_org()): one evaluation a statement, not one a row.
CREATE FUNCTION lease_org() RETURNS uuid
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    RETURN (SELECT j.organization_id FROM jobs j
            WHERE j.id = nullif(current_setting('app.job_id', true), '')::uuid
              AND j.lease_token = nullif(current_setting('app.lease_token', true), '')::uuid
              AND j.status IN ('leased', 'cancel_requested'));
END $$;
REVOKE ALL ON FUNCTION lease_org() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lease_org() TO space_worker;

-- The worker's tenant data: that of the organization whose lease it presents, nothing else.
CREATE POLICY worker_lease_read ON organizations FOR SELECT TO space_worker
    USING (id = (SELECT lease_org()));
CREATE POLICY worker_lease_read ON memberships FOR SELECT TO space_worker
    USING (organization_id = (SELECT lease_org()));
CREATE POLICY worker_lease_rw ON projects TO space_worker
    USING (organization_id = (SELECT lease_org()))
    WITH CHECK (organization_id = (SELECT lease_org()));

-- The job's status while the caller's token holds its lease; NULL otherwise.
CREATE FUNCTION lease_status(p_id uuid, p_token uuid) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    RETURN (SELECT j.status FROM jobs j
            WHERE j.id = p_id AND j.lease_token = p_token
              AND j.status IN ('leased', 'cancel_requested'));
END $$;
REVOKE ALL ON FUNCTION lease_status(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lease_status(uuid, uuid) TO space_worker;

-- Taken at the end of every tenant transaction of a job: its writes commit only while the
-- attempt still holds the lease, and nobody can re-claim the row until that commit. False when
-- the token no longer holds it.
CREATE FUNCTION lock_lease(p_id uuid, p_token uuid) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    PERFORM 1 FROM jobs j
    WHERE j.id = p_id AND j.lease_token = p_token AND j.status IN ('leased', 'cancel_requested')
    FOR UPDATE;
    RETURN FOUND;
END $$;
REVOKE ALL ON FUNCTION lock_lease(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lock_lease(uuid, uuid) TO space_worker;

-- Heartbeat, one statement for every lease a worker process holds. A job missing from the
-- answer is no longer the caller's (expired and taken, or ended); its status says whether a
-- cancel was asked for.
CREATE FUNCTION extend_leases(p_ids uuid[], p_tokens uuid[])
RETURNS TABLE (id uuid, status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
-- A plan that joins the ids given to the rows found by nested loop compares every row with
-- every id and reads the ids' list once a row: a batch's cost grew with its square (1,000
-- leases: 200 us a job, not 35). The rows are found through the primary key (id = ANY), and
-- with nested loops off the two sets are joined by hash (revision 0063).
SET enable_nestloop = off AS $$
BEGIN
    RETURN QUERY
    UPDATE jobs j
    SET lease_until = clock_timestamp() + j.lease_seconds * interval '1 second'
    FROM unnest(p_ids, p_tokens) AS held (job_id, token)
    WHERE j.id = ANY (p_ids) AND j.id = held.job_id AND j.lease_token = held.token
      AND j.status IN ('leased', 'cancel_requested')
    RETURNING j.id, j.status;
END $$;
REVOKE ALL ON FUNCTION extend_leases(uuid[], uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION extend_leases(uuid[], uuid[]) TO space_worker;

-- Measured progress of a held job; the job's status, or NULL when the lease is not the caller's.
CREATE FUNCTION record_progress(p_id uuid, p_token uuid, p_progress jsonb) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    found_status text;
BEGIN
    UPDATE jobs j SET progress = p_progress
    WHERE j.id = p_id AND j.lease_token = p_token AND j.status IN ('leased', 'cancel_requested')
    RETURNING j.status INTO found_status;
    RETURN found_status;
END $$;
REVOKE ALL ON FUNCTION record_progress(uuid, uuid, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION record_progress(uuid, uuid, jsonb) TO space_worker;

-- The fenced finish of many jobs in one statement: a job is completed only while the caller's
-- token still holds its lease; one whose token moved on (a newer attempt owns it) is left alone
-- and missing from the answer, and counted as a stale finish under its kind (the database's
-- own kinds: a caller cannot add labels). A cancel that arrived too late loses to a finished
-- job (cancel_requested -> completed). A large result's file is already in the results store;
-- p_refs names it (and the result describes it).
CREATE FUNCTION complete_jobs(p_ids uuid[], p_tokens uuid[], p_results jsonb[], p_refs text[])
RETURNS TABLE (id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
-- The leases given joined to their rows by hash, never by nested loop: see extend_leases().
SET enable_nestloop = off AS $$
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
REVOKE ALL ON FUNCTION complete_jobs(uuid[], uuid[], jsonb[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION complete_jobs(uuid[], uuid[], jsonb[], text[]) TO space_worker;

-- One decision for every failed attempt, fenced like the finish: a requested cancel wins, a
-- permanent error or the last attempt fails the job, anything else goes back to the queue with
-- run_after pushed out by the caller's backoff (at most a day). An unexpected exception's
-- diagnosis (its classes and frames, never a message: models/diagnostics.py) is kept for
-- operators in the same transaction, for the attempt that failed. No row when the lease is not
-- the caller's.
CREATE FUNCTION fail_job(p_id uuid, p_token uuid, p_permanent boolean, p_retry_in double precision,
                         p_error_code text, p_error_message text, p_worker text DEFAULT NULL,
                         p_exception_class text DEFAULT NULL, p_traceback text DEFAULT NULL)
RETURNS TABLE (status text, run_after timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    failed jobs;
BEGIN
    UPDATE jobs j
    SET status = CASE
            WHEN j.status = 'cancel_requested' THEN 'cancelled'
            WHEN p_permanent OR j.attempts >= j.max_attempts THEN 'failed'
            ELSE 'queued' END,
        run_after = CASE
            WHEN j.status = 'leased' AND NOT p_permanent AND j.attempts < j.max_attempts
            THEN clock_timestamp() + least(greatest(p_retry_in, 0), 86400) * interval '1 second'
            ELSE j.run_after END,
        error_code = p_error_code, error_message = p_error_message,
        lease_token = NULL, lease_until = NULL, leased_by = NULL, last_wakeup_at = NULL
    WHERE j.id = p_id AND j.lease_token = p_token AND j.status IN ('leased', 'cancel_requested')
    RETURNING j.* INTO failed;
    IF failed.id IS NULL THEN
        RETURN;
    END IF;
    IF p_exception_class IS NOT NULL THEN
        INSERT INTO job_diagnostics (job_id, organization_id, attempt, worker, exception_class,
                                     traceback)
        VALUES (failed.id, failed.organization_id, failed.attempts, p_worker,
                left(p_exception_class, 1000), left(coalesce(p_traceback, ''), 100000));
    END IF;
    RETURN QUERY SELECT failed.status, failed.run_after;
END $$;
REVOKE ALL ON FUNCTION fail_job(uuid, uuid, boolean, double precision, text, text, text, text, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fail_job(uuid, uuid, boolean, double precision, text, text, text, text,
                                   text)
    TO space_worker;

-- The running job saw cancel_requested at a safe point and stops. False when the lease is not
-- the caller's (or no cancel was asked for).
CREATE FUNCTION acknowledge_cancel(p_id uuid, p_token uuid) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    UPDATE jobs j
    SET status = 'cancelled', lease_token = NULL, lease_until = NULL, leased_by = NULL
    WHERE j.id = p_id AND j.lease_token = p_token AND j.status = 'cancel_requested';
    RETURN FOUND;
END $$;
REVOKE ALL ON FUNCTION acknowledge_cancel(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION acknowledge_cancel(uuid, uuid) TO space_worker;

-- Graceful shutdown: give held jobs back untouched, the attempt not burned, claimable at once.
CREATE FUNCTION release_jobs(p_ids uuid[], p_tokens uuid[]) RETURNS TABLE (id uuid)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
-- The leases given joined to their rows by hash, never by nested loop: see extend_leases().
SET enable_nestloop = off AS $$
BEGIN
    RETURN QUERY
    UPDATE jobs j
    SET status = 'queued', attempts = j.attempts - 1, run_after = now(),
        lease_token = NULL, lease_until = NULL, leased_by = NULL, last_wakeup_at = NULL
    FROM unnest(p_ids, p_tokens) AS held (job_id, token)
    WHERE j.id = ANY (p_ids) AND j.id = held.job_id AND j.lease_token = held.token
      AND j.status = 'leased'
    RETURNING j.id;
END $$;
REVOKE ALL ON FUNCTION release_jobs(uuid[], uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION release_jobs(uuid[], uuid[]) TO space_worker;

-- The sweeper, bounded per call: leases that ran out go back to the queue (attempts left),
-- fail (none left: lease_expired) or end cancelled (a cancel was asked for). Several sweepers on
-- several hosts take disjoint batches (SKIP LOCKED). What a caller can do through it is what
-- the sweeper does anyway: nothing to a job whose lease still runs.
--
-- Only leases that ran out at or after p_from (expired_leases_horizon(), below): the index
-- keeps an entry for every lease any job ever held until vacuum removes it, and behind a
-- long-open transaction a walk from its beginning read every job finished since it began.
CREATE FUNCTION sweep_expired_leases(p_batch integer, p_from timestamptz)
RETURNS TABLE (id uuid, status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    RETURN QUERY
    WITH expired AS (
        SELECT e.id FROM jobs e
        WHERE e.status IN ('leased', 'cancel_requested') AND e.lease_until < now()
          AND e.lease_until >= p_from
        ORDER BY e.lease_until
        LIMIT least(greatest(p_batch, 1), 10000)
        FOR UPDATE SKIP LOCKED
    )
    UPDATE jobs j
    SET status = CASE
            WHEN j.status = 'cancel_requested' THEN 'cancelled'
            WHEN j.attempts >= j.max_attempts THEN 'failed'
            ELSE 'queued' END,
        error_code = CASE
            WHEN j.status = 'leased' AND j.attempts >= j.max_attempts THEN 'lease_expired'
            ELSE j.error_code END,
        error_message = CASE
            WHEN j.status = 'leased' AND j.attempts >= j.max_attempts
            THEN 'The job stopped responding and has no attempts left.'
            ELSE j.error_message END,
        run_after = now(), lease_token = NULL, lease_until = NULL, leased_by = NULL,
        last_wakeup_at = NULL
    FROM expired WHERE j.id = expired.id
    RETURNING j.id, j.status;
END $$;
REVOKE ALL ON FUNCTION sweep_expired_leases(integer, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sweep_expired_leases(integer, timestamptz) TO space_worker;

-- The previous release's beat, during a rolling deploy: from the first lease.
CREATE FUNCTION sweep_expired_leases(p_batch integer) RETURNS TABLE (id uuid, status text)
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT s.id, s.status FROM sweep_expired_leases(p_batch, '-infinity') AS s
$$;
REVOKE ALL ON FUNCTION sweep_expired_leases(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sweep_expired_leases(integer) TO space_worker;

-- Where the next sweep of expired leases may start, after one that started at p_from: no lease
-- held now, in this transaction's view, ran out before the earliest one held from p_from on,
-- and none taken from now on ends before now (a lease is taken for at least a second from its
-- claim). A minute earlier than both, for a claim that began before this transaction and
-- commits after it. A lease could only end before the horizon if something moved its end
-- back, which nothing here does; the sweeper still starts from the first lease now and then.
CREATE FUNCTION expired_leases_horizon(p_from timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT least(now(), (SELECT min(e.lease_until) FROM jobs e
                         WHERE e.status IN ('leased', 'cancel_requested')
                           AND e.lease_until >= p_from))
           - interval '1 minute'
$$;
REVOKE ALL ON FUNCTION expired_leases_horizon(timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION expired_leases_horizon(timestamptz) TO space_worker;

-- Due jobs that nobody claimed within p_grace seconds get a fresh wake-up: this is what makes a
-- lost Redis message cost latency, never a job. Marking last_wakeup_at first keeps several
-- sweepers from re-sending the same wake-up. A job put back in the queue (retry, expired lease,
-- release at shutdown) has last_wakeup_at cleared, so it is signalled as soon as it is due; a
-- new job (last_wakeup_at = its submit) first gets the grace period for the web's own wake-up.
-- Bounded per call; it changes nothing but the mark.
--
-- Read as the claim reads (revision 0052): each (organization, priority) key's jobs from its
-- head on (claim_ring(), claim_levels()), never jobs_claimable_idx from its beginning, where
-- behind a long-open transaction the entries of every job queued since it began lie. Every
-- queued job is at or after its key's head (38_claim_heads.sql).
CREATE FUNCTION sweep_unsignalled(p_grace double precision, p_batch integer)
RETURNS TABLE (id uuid, kind text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
SET jit = off SET enable_seqscan = off SET enable_bitmapscan = off AS $$
DECLARE
    wanted CONSTANT integer := least(greatest(p_batch, 1), 10000);
    grace CONSTANT interval := greatest(p_grace, 0) * interval '1 second';
BEGIN
    RETURN QUERY
    WITH candidates AS (
        SELECT d.id
        FROM claim_ring('00000000-0000-0000-0000-000000000000', 1000000000) AS r
        CROSS JOIN LATERAL claim_levels(r.org) AS h
        CROSS JOIN LATERAL (
            SELECT m.id, m.run_after, m.created_at FROM jobs m
            WHERE m.organization_id = r.org AND m.priority = h.priority
              AND m.status = 'queued'
              AND (m.run_after, m.created_at) >= (h.run_after, h.created_at)
              AND m.run_after <= now()
              AND (m.last_wakeup_at IS NULL OR m.last_wakeup_at <= now() - grace)
            ORDER BY m.priority DESC, m.run_after, m.created_at
            LIMIT wanted
        ) AS d
        ORDER BY d.run_after, d.created_at
        LIMIT wanted
    ), due AS (
        -- Locked by key alone: with the status among its conditions, the planner may read the
        -- partial indexes of queued jobs instead of jobs_pkey, and a long-open transaction
        -- fills them. A job a claim took between the look and the lock is marked and woken all
        -- the same: one wake-up too many, for which a claim finds nothing.
        SELECT j.id FROM jobs j JOIN candidates c ON j.id = c.id
        FOR UPDATE OF j SKIP LOCKED
    )
    UPDATE jobs j SET last_wakeup_at = now()
    FROM due WHERE j.id = due.id
    RETURNING j.id, j.kind;
END $$;
REVOKE ALL ON FUNCTION sweep_unsignalled(double precision, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sweep_unsignalled(double precision, integer) TO space_worker;
