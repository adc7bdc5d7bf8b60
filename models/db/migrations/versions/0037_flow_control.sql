-- Flow control (revision 0037): sequences, debounce, rate limits, fair shares by time.
ALTER TABLE jobs ADD COLUMN sequence_key text
    CONSTRAINT jobs_sequence_key_length CHECK (length(sequence_key) BETWEEN 1 AND 200);
ALTER TABLE jobs ADD COLUMN sequence_position bigint;
ALTER TABLE jobs ADD COLUMN debounce_seconds integer
    CONSTRAINT jobs_debounce_seconds_range CHECK (debounce_seconds BETWEEN 1 AND 86400);
ALTER TABLE jobs ADD CONSTRAINT jobs_sequence_has_a_place
    CHECK ((sequence_key IS NULL) = (sequence_position IS NULL));
ALTER TABLE jobs ADD CONSTRAINT jobs_debounce_has_a_key
    CHECK (debounce_seconds IS NULL OR dedup_key IS NOT NULL);

-- The places of jobs in their sequences: taken under the sequence's lock (submit_job()).
CREATE SEQUENCE job_sequence_positions AS bigint;

-- claim_jobs: a sequence's unfinished jobs by place (an earlier one holds the later back).
CREATE INDEX jobs_sequence_idx ON jobs (organization_id, sequence_key, sequence_position)
    WHERE sequence_key IS NOT NULL
      AND status IN ('queued', 'leased', 'cancel_requested', 'waiting');
-- claim_jobs: how many jobs an organization runs now (its fair share by time).
CREATE INDEX jobs_org_running_idx ON jobs (organization_id)
    WHERE status IN ('leased', 'cancel_requested');
-- claim_jobs: a rate-limited kind's organizations with queued jobs, and their jobs in order.
CREATE INDEX jobs_kind_claim_idx ON jobs (kind, organization_id, priority DESC, run_after,
                                          created_at)
    WHERE status = 'queued';
-- A debounced key is not an active duplicate: while its job is queued and never started, a
-- submit of the key updates that job (jobs_debounce_idx), and after that it makes a new one.
DROP INDEX jobs_dedup_active_idx;
CREATE UNIQUE INDEX jobs_dedup_active_idx ON jobs (organization_id, kind, dedup_key)
    WHERE dedup_key IS NOT NULL AND debounce_seconds IS NULL
      AND status IN ('queued', 'leased', 'cancel_requested', 'waiting');
CREATE UNIQUE INDEX jobs_debounce_idx ON jobs (organization_id, kind, dedup_key)
    WHERE debounce_seconds IS NOT NULL AND status = 'queued' AND attempts = 0;

GRANT SELECT (sequence_key, sequence_position, debounce_seconds) ON jobs
    TO space_app, space_worker, space_operator;

-- Operators' rate limits: at most max_starts jobs of the kind start in the organization in any
-- per_seconds. Without a row the kind's own (a declared rate_limit) applies, or none. Written by
-- the owner (the CLI's `orgs set-rate-limit`) and by set_rate_limit() (the operators'
-- dashboard); read by claim_jobs() as the owner and by the operators' dashboard.
CREATE TABLE job_rate_limits (
    organization_id  uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    kind             text NOT NULL CHECK (kind ~ '^[a-z][a-z0-9_.]{0,63}$'),
    max_starts       integer NOT NULL CHECK (max_starts BETWEEN 1 AND 10000),
    per_seconds      integer NOT NULL CHECK (per_seconds BETWEEN 1 AND 86400),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, kind)
);

-- The recent starts of each rate-limited (organization, kind): the window's worth, newest
-- first, at most the limit. Its row lock is what claimers of the pair take turns on
-- (claim_jobs()). The owner's alone.
CREATE TABLE rate_limit_windows (
    organization_id  uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    kind             text NOT NULL,
    starts           timestamptz[] NOT NULL DEFAULT '{}',
    PRIMARY KEY (organization_id, kind)
);

ALTER TABLE job_rate_limits ENABLE ROW LEVEL SECURITY;
ALTER TABLE job_rate_limits FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON job_rate_limits TO space_owner USING (true) WITH CHECK (true);
CREATE POLICY operator_read ON job_rate_limits FOR SELECT TO space_operator USING (true);
GRANT SELECT ON job_rate_limits TO space_operator;

ALTER TABLE rate_limit_windows ENABLE ROW LEVEL SECURITY;
ALTER TABLE rate_limit_windows FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON rate_limit_windows TO space_owner USING (true) WITH CHECK (true);

-- A debounce is written to the organization's audit log, as a submit is.
ALTER TABLE org_audit DROP CONSTRAINT org_audit_action_check;
ALTER TABLE org_audit ADD CONSTRAINT org_audit_action_check CHECK (action IN (
    'job.submit', 'job.cancel', 'job.download', 'member.add', 'member.role_change',
    'member.remove', 'organization.state_change', 'job.debounce'));

-- A debounce may change the params and the submitter of a queued job that never started.
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
    NEW.updated_at := now();
    RETURN NEW;
END $$;

DROP FUNCTION claim_jobs(text, integer, text[], text, uuid);

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
-- Every step reads an index (jobs_fair_claim_idx, jobs_kind_claim_idx, jobs_org_running_idx,
-- jobs_sequence_idx: a job of a sequence waits while an earlier place of its key is unfinished;
-- leases that ran out, jobs_lease_expiry_idx); SKIP LOCKED lets concurrent
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
    WITH RECURSIVE
    -- The ring of organizations with queued jobs, from just after p_after_organization round to
    -- it again: a loose index scan, one probe per organization. At least 32 of them even for a
    -- small batch, so that concurrent claimers whose first organizations' jobs are locked by
    -- each other (SKIP LOCKED) still find the next ones'.
    after_cursor (org, n) AS (
        SELECT (SELECT q.organization_id FROM jobs q
                WHERE q.status = 'queued' AND q.organization_id > p_after_organization
                ORDER BY q.organization_id LIMIT 1), 1
        UNION ALL
        SELECT (SELECT q.organization_id FROM jobs q
                WHERE q.status = 'queued' AND q.organization_id > a.org
                ORDER BY q.organization_id LIMIT 1), a.n + 1
        FROM after_cursor a WHERE a.org IS NOT NULL AND a.n < greatest(p_limit, 32)
    ), from_start (org, n) AS (
        SELECT (SELECT q.organization_id FROM jobs q WHERE q.status = 'queued'
                ORDER BY q.organization_id LIMIT 1), 1
        UNION ALL
        SELECT (SELECT q.organization_id FROM jobs q
                WHERE q.status = 'queued' AND q.organization_id > f.org
                ORDER BY q.organization_id LIMIT 1), f.n + 1
        FROM from_start f
        WHERE f.org IS NOT NULL AND f.org < p_after_organization AND f.n < greatest(p_limit, 32)
    ), ring AS (
        SELECT r.org, r.position FROM (
            SELECT a.org, a.n AS position FROM after_cursor a WHERE a.org IS NOT NULL
            UNION ALL
            SELECT f.org, greatest(p_limit, 32) + f.n FROM from_start f
            WHERE f.org IS NOT NULL AND f.org <= p_after_organization
        ) AS r
        ORDER BY r.position
        LIMIT greatest(p_limit, 32)
    ), shares AS (
        -- Each organization's share of the batch, in proportion to its weight (at least one),
        -- the jobs it runs now, and the kinds rate limited there (taken above).
        SELECT r.org, r.position, o.claim_weight AS weight,
               p_rate_kinds || ARRAY(SELECT l.kind FROM job_rate_limits l
                                     WHERE l.organization_id = r.org) AS rate_limited,
               ceil((p_limit - taken) * o.claim_weight::numeric
                    / sum(o.claim_weight) OVER ())::integer AS share,
               (SELECT count(*) FROM jobs b
                WHERE b.organization_id = r.org AND b.status IN ('leased', 'cancel_requested'))
                   AS running
        FROM ring r JOIN organizations o ON o.id = r.org
    ), queued AS (
        SELECT s.position, s.weight, s.running, c.ctid, c.priority, c.run_after, c.created_at
        FROM shares s CROSS JOIN LATERAL (
            SELECT q.ctid, q.priority, q.run_after, q.created_at FROM jobs q
            WHERE q.organization_id = s.org AND q.status = 'queued' AND q.run_after <= now()
              AND q.kind <> ALL (p_skip_kinds) AND q.kind <> ALL (s.rate_limited)
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
    ), expired AS (
        -- A lease that ran out while attempts remain is claimable at once (the sweeper would
        -- otherwise requeue it a little later); cancel_requested is not: an expired cancel
        -- request ends cancelled, never retried. A rate-limited kind's waits for the sweeper,
        -- which puts it back in the queue, where its window counts it.
        SELECT e.ctid FROM jobs e
        WHERE e.status = 'leased' AND e.lease_until < now() AND e.attempts < e.max_attempts
          AND e.kind <> ALL (p_skip_kinds) AND e.kind <> ALL (p_rate_kinds)
          AND NOT EXISTS (SELECT 1 FROM job_rate_limits l
                          WHERE l.organization_id = e.organization_id AND l.kind = e.kind)
          AND (p_only_kind IS NULL OR e.kind = p_only_kind)
        ORDER BY e.lease_until
        LIMIT p_limit - taken
        FOR UPDATE SKIP LOCKED
    ), chosen AS (
        SELECT c.ctid FROM (SELECT x.ctid FROM expired x UNION ALL SELECT y.ctid FROM interleaved y)
            AS c
        LIMIT p_limit - taken
    )
    UPDATE jobs j
    SET status = 'leased', lease_token = gen_random_uuid(), leased_by = p_worker,
        lease_until = clock_timestamp() + j.lease_seconds * interval '1 second',
        attempts = j.attempts + 1, started_at = coalesce(j.started_at, now())
    -- By the row versions the CTEs locked (FOR UPDATE: nobody else can move them before this
    -- UPDATE), a TID scan: no second probe of jobs_pkey per job (revision 0017).
    WHERE j.ctid = ANY (ARRAY(SELECT chosen.ctid FROM chosen))
    RETURNING j.id, j.organization_id, j.requested_by, j.kind, j.params, j.attempts,
              j.max_attempts, j.lease_token, j.lease_seconds, j.request_id,
              -- whether more was due than this claim took (as of its start): the claimer then
              -- tells another process, since wake-ups are coalesced
              (SELECT count(*) > p_limit FROM (
                  SELECT 1 FROM jobs m WHERE m.status = 'queued' AND m.run_after <= now()
                  ORDER BY m.run_after LIMIT p_limit + 1) AS due),
              NULL::timestamptz;
    GET DIAGNOSTICS got = ROW_COUNT;
    IF got = 0 AND taken = 0 THEN
        -- Nothing taken: one row with no job says whether jobs were due all the same (locked
        -- by concurrent claimers for a moment), so the caller may try again instead of idling.
        -- Jobs held back by a rate limit or a sequence are not: they are not claimable yet.
        RETURN QUERY SELECT NULL::uuid, NULL::uuid, NULL::uuid, NULL::text, NULL::jsonb,
                            NULL::integer, NULL::integer, NULL::uuid, NULL::integer, NULL::text,
                            EXISTS (SELECT 1 FROM jobs m
                                    WHERE m.status = 'queued' AND m.run_after <= now()
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
                        AND p.status IN ('queued', 'leased', 'cancel_requested', 'waiting')))),
                            next_window;
    END IF;
END $$;
REVOKE ALL ON FUNCTION claim_jobs(text, integer, text[], text, uuid, text[], integer[], integer[])
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION claim_jobs(text, integer, text[], text, uuid, text[], integer[], integer[])
    TO space_worker;

DROP FUNCTION submit_job(uuid, uuid, text, jsonb, integer, integer, text[], text, text, text, text,
                         timestamptz, uuid, integer, integer, integer, text);
DROP FUNCTION submit_jobs(uuid, uuid, text[], text, text, uuid[], text[], jsonb[], integer[],
                          integer[], text[], timestamptz[], integer, integer[], integer[], text);

-- Called by name (models/jobs/store.sql: `p_kind => ...`), so no caller depends on the order
-- of sixteen arguments, three of them text side by side that a positional slip would swap
-- without an error. The optional ones default to NULL ("none"), so a caller leaves out what it
-- does not use, and a later optional argument (DROP + CREATE with a default) does not break a
-- caller that does not pass it, such as the previous release's web during a rolling deploy.
-- Not one jsonb or composite argument: each value keeps its PostgreSQL type, checked at the
-- call before the body runs, and a composite type would be one more object whose fields are
-- positional again.
--
-- outcome: 'created', 'replayed' (an Idempotency-Key seen before: the first job is answered,
-- whatever the quota), 'debounced' (p_debounce_seconds: a queued, never started job with the
-- dedup_key took these params and starts p_debounce_seconds from now; it is answered),
-- 'duplicate' (an active job has the dedup_key: its id is answered),
-- 'over_quota' (nothing written; quota_kind and quota_limit say which cap), or 'refused' (the
-- requester's role and the organization's state are answered, NULL for a non-member, so the
-- caller can say why in its own words).
CREATE FUNCTION submit_job(
    p_organization_id uuid, p_requested_by uuid, p_kind text, p_params jsonb,
    p_max_attempts integer, p_lease_seconds integer, p_org_states text[], p_role text,
    p_dedup_key text DEFAULT NULL, p_idempotency_key text DEFAULT NULL,
    p_request_id text DEFAULT NULL, p_run_after timestamptz DEFAULT NULL,
    p_retry_of uuid DEFAULT NULL, p_org_quota integer DEFAULT NULL,
    p_kind_quota integer DEFAULT NULL, p_priority integer DEFAULT NULL,
    p_traceparent text DEFAULT NULL, p_sequence_key text DEFAULT NULL,
    p_debounce_seconds integer DEFAULT NULL)
RETURNS TABLE (
    outcome text, member_role text, member_organization_state text,
    id uuid, organization_id uuid, requested_by uuid, kind text, status text, attempts integer,
    max_attempts integer, progress jsonb, error_code text, error_message text, dedup_key text,
    run_after timestamptz, created_at timestamptz, updated_at timestamptz,
    started_at timestamptz, finished_at timestamptz, cancel_requested_at timestamptz,
    leased_by text, lease_until timestamptz, result_expired_at timestamptz, params jsonb,
    quota_kind text, quota_limit integer, sequence_key text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    -- before the FOR SHARE below, which takes a transaction id without writing a job
    first_write CONSTANT boolean := pg_current_xact_id_if_assigned() IS NULL;
    standing record;
    refusal record;
    made jobs;
BEGIN
    SELECT m.role, o.state INTO standing
    FROM memberships m JOIN organizations o ON o.id = m.organization_id
    WHERE m.organization_id = p_organization_id AND m.user_id = p_requested_by
    FOR SHARE OF m, o;
    IF NOT FOUND OR standing.state <> ALL (p_org_states)
       OR role_rank(standing.role) < role_rank(p_role) THEN
        RETURN QUERY SELECT 'refused', standing.role, standing.state, NULL::uuid, NULL::uuid,
            NULL::uuid, NULL, NULL, NULL::integer, NULL::integer, NULL::jsonb, NULL, NULL, NULL,
            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
            NULL::timestamptz, NULL::timestamptz, NULL, NULL::timestamptz, NULL::timestamptz,
            NULL::jsonb, NULL, NULL::integer, NULL;
        RETURN;
    END IF;

    IF p_sequence_key IS NOT NULL THEN
        -- One submit of a sequence at a time, each taking its place after the last one's
        -- commit: were two in flight, the later place could commit first, run, and then the
        -- earlier one start beside it (the claim sees only what has committed).
        PERFORM pg_advisory_xact_lock(hashtext('spacejobs.sequence:' || p_organization_id::text
                                               || ':' || p_sequence_key));
    END IF;
    IF p_debounce_seconds IS NOT NULL AND p_dedup_key IS NOT NULL THEN
        -- The queued, never started job with this key takes the new params and moves its
        -- start. Debounces of one key take turns (the lock, until commit), so each sees the
        -- job the one before made; a claim that leases the job first (its row lock, then a
        -- status this no longer matches) leaves nothing to update, and a new job is made.
        PERFORM pg_advisory_xact_lock(hashtext('spacejobs.debounce:' || p_organization_id::text
                                               || ':' || p_kind || ':' || p_dedup_key));
        UPDATE jobs j
        SET params = p_params, requested_by = p_requested_by,
            run_after = now() + p_debounce_seconds * interval '1 second',
            debounce_seconds = p_debounce_seconds, request_id = p_request_id
        WHERE j.organization_id = p_organization_id AND j.kind = p_kind
          AND j.dedup_key = p_dedup_key AND j.debounce_seconds IS NOT NULL
          AND j.status = 'queued' AND j.attempts = 0
        RETURNING * INTO made;
        IF made.id IS NOT NULL THEN
            INSERT INTO org_audit (organization_id, actor_id, actor, action, job_id, detail,
                                   request_id)
            VALUES (p_organization_id, coalesce(app_user(), p_requested_by),
                    coalesce(app_actor(), 'user:' || p_requested_by), 'job.debounce', made.id,
                    jsonb_build_object('kind', p_kind), p_request_id);
            RETURN QUERY SELECT 'debounced', standing.role, standing.state, made.id,
                made.organization_id, made.requested_by, made.kind, made.status, made.attempts,
                made.max_attempts, made.progress, made.error_code, made.error_message,
                made.dedup_key, made.run_after, made.created_at, made.updated_at,
                made.started_at, made.finished_at, made.cancel_requested_at, made.leased_by,
                made.lease_until, made.result_expired_at, made.params, NULL, NULL::integer,
                made.sequence_key;
            RETURN;
        END IF;
    END IF;

    -- A replay answers the first job even at the cap: it asks for nothing new.
    IF p_idempotency_key IS NOT NULL THEN
        SELECT * INTO made FROM jobs j
        WHERE j.organization_id = p_organization_id AND j.requested_by = p_requested_by
          AND j.idempotency_key = p_idempotency_key;
    END IF;
    IF made.id IS NULL THEN
        SELECT * INTO refusal
        FROM admit_jobs(p_organization_id, ARRAY[p_kind], ARRAY[p_kind_quota], p_org_quota,
                        first_write);
        IF FOUND THEN
            RETURN QUERY SELECT 'over_quota', standing.role, standing.state, NULL::uuid,
                NULL::uuid, NULL::uuid, NULL, NULL, NULL::integer, NULL::integer, NULL::jsonb,
                NULL, NULL, NULL, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL, NULL::timestamptz,
                NULL::timestamptz, NULL::jsonb, refusal.refused_kind, refusal.cap, NULL;
            RETURN;
        END IF;

        INSERT INTO jobs (organization_id, requested_by, kind, params, max_attempts,
                          lease_seconds, dedup_key, idempotency_key, request_id, run_after,
                          retry_of, priority, traceparent, sequence_key, sequence_position,
                          debounce_seconds)
        VALUES (p_organization_id, p_requested_by, p_kind, p_params,
                least(greatest(p_max_attempts, 1), 100), least(greatest(p_lease_seconds, 1), 86400),
                p_dedup_key, p_idempotency_key, p_request_id,
                CASE WHEN p_debounce_seconds IS NOT NULL AND p_dedup_key IS NOT NULL
                     THEN greatest(coalesce(p_run_after, now()),
                                   now() + p_debounce_seconds * interval '1 second')
                     ELSE coalesce(p_run_after, now()) END,
                -- an operator's retry-as-new-job points back at the job it retries, in its org
                (SELECT r.id FROM jobs r WHERE r.id = p_retry_of
                                            AND r.organization_id = p_organization_id),
                -- out of range is the column CHECK's refusal, never a silent clamp
                coalesce(p_priority, 0), p_traceparent, p_sequence_key,
                CASE WHEN p_sequence_key IS NOT NULL THEN nextval('job_sequence_positions') END,
                CASE WHEN p_dedup_key IS NOT NULL THEN p_debounce_seconds END)
        ON CONFLICT DO NOTHING
        RETURNING * INTO made;
        IF made.id IS NOT NULL THEN
            -- Who started it, for the organization's audit log: the scoped user (an operator's
            -- retry scopes the operator), else the requester.
            INSERT INTO org_audit (organization_id, actor_id, actor, action, job_id, detail,
                                   request_id)
            VALUES (p_organization_id, coalesce(app_user(), p_requested_by),
                    coalesce(app_actor(), 'user:' || p_requested_by), 'job.submit', made.id,
                    jsonb_strip_nulls(jsonb_build_object('kind', p_kind, 'retry_of', made.retry_of)),
                    p_request_id);
            RETURN QUERY SELECT 'created', standing.role, standing.state, made.id,
                made.organization_id, made.requested_by, made.kind, made.status, made.attempts,
                made.max_attempts, made.progress, made.error_code, made.error_message,
                made.dedup_key, made.run_after, made.created_at, made.updated_at,
                made.started_at, made.finished_at, made.cancel_requested_at, made.leased_by,
                made.lease_until, made.result_expired_at, made.params, NULL, NULL::integer,
                made.sequence_key;
            RETURN;
        END IF;

        -- A conflict: the same Idempotency-Key committed meanwhile, or an active duplicate.
        IF p_idempotency_key IS NOT NULL THEN
            SELECT * INTO made FROM jobs j
            WHERE j.organization_id = p_organization_id AND j.requested_by = p_requested_by
              AND j.idempotency_key = p_idempotency_key;
        END IF;
    END IF;
    IF made.id IS NULL THEN
        SELECT * INTO made FROM jobs j
        WHERE j.organization_id = p_organization_id AND j.kind = p_kind
          AND j.dedup_key = p_dedup_key AND j.status IN ('queued', 'leased', 'cancel_requested')
          AND (j.debounce_seconds IS NULL) = (p_debounce_seconds IS NULL);
        -- The conflicting job may have ended in between: then there is nothing to name, and
        -- the caller may simply submit again.
    END IF;
    RETURN QUERY SELECT CASE WHEN p_idempotency_key IS NOT NULL AND made.idempotency_key
                                  IS NOT DISTINCT FROM p_idempotency_key
                             THEN 'replayed' ELSE 'duplicate' END,
        standing.role, standing.state, made.id,
        made.organization_id, made.requested_by, made.kind, made.status, made.attempts,
        made.max_attempts, made.progress, made.error_code, made.error_message,
        made.dedup_key, made.run_after, made.created_at, made.updated_at, made.started_at,
        made.finished_at, made.cancel_requested_at, made.leased_by, made.lease_until,
        made.result_expired_at, made.params, NULL, NULL::integer, made.sequence_key;
END $$;
REVOKE ALL ON FUNCTION submit_job(uuid, uuid, text, jsonb, integer, integer, text[], text, text,
                                  text, text, timestamptz, uuid, integer, integer, integer, text, text,
                                  integer)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION submit_job(uuid, uuid, text, jsonb, integer, integer, text[], text, text,
                                     text, text, timestamptz, uuid, integer, integer, integer, text, text,
                                     integer)
    TO space_app, space_worker;

-- The bulk submit: many jobs of the organization in one statement, ids made by the caller so
-- the answer keeps the request's order. The standing is checked once against the strictest
-- rules of the batch's kinds (every state they all allow, the highest role any needs): the
-- caller tells which item a refusal concerns. The whole batch is admitted against the caps or
-- none of it. A row that meets an active duplicate is skipped and missing from the answer; the
-- caller then rolls the batch back: all or nothing.
-- Called by name too (store.sql), without defaults but the last: its one caller passes every
-- argument, and defaults would need the optional p_request_id moved behind the required
-- arrays, a new signature for no caller's gain. p_traceparent (revision 0034) is the batch's
-- one trace context, optional so that the previous release's web still calls it; so are
-- p_sequence_keys (revision 0037), each job's own, taking places in the batch's order.
CREATE FUNCTION submit_jobs(
    p_organization_id uuid, p_requested_by uuid, p_org_states text[], p_role text,
    p_request_id text, p_ids uuid[], p_kinds text[], p_params jsonb[], p_max_attempts integer[],
    p_lease_seconds integer[], p_dedup_keys text[], p_run_afters timestamptz[],
    p_org_quota integer, p_kind_quotas integer[], p_priorities integer[],
    p_traceparent text DEFAULT NULL, p_sequence_keys text[] DEFAULT NULL)
RETURNS TABLE (
    outcome text, member_role text, member_organization_state text,
    id uuid, organization_id uuid, requested_by uuid, kind text, status text, attempts integer,
    max_attempts integer, progress jsonb, error_code text, error_message text, dedup_key text,
    run_after timestamptz, created_at timestamptz, updated_at timestamptz,
    started_at timestamptz, finished_at timestamptz, cancel_requested_at timestamptz,
    leased_by text, lease_until timestamptz, result_expired_at timestamptz, params jsonb,
    quota_kind text, quota_limit integer, sequence_key text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    standing record;
    refusal record;
    sequence_lock integer;
BEGIN
    SELECT m.role, o.state INTO standing
    FROM memberships m JOIN organizations o ON o.id = m.organization_id
    WHERE m.organization_id = p_organization_id AND m.user_id = p_requested_by
    FOR SHARE OF m, o;
    IF NOT FOUND OR standing.state <> ALL (p_org_states)
       OR role_rank(standing.role) < role_rank(p_role) THEN
        RETURN QUERY SELECT 'refused', standing.role, standing.state, NULL::uuid, NULL::uuid,
            NULL::uuid, NULL, NULL, NULL::integer, NULL::integer, NULL::jsonb, NULL, NULL, NULL,
            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
            NULL::timestamptz, NULL::timestamptz, NULL, NULL::timestamptz, NULL::timestamptz,
            NULL::jsonb, NULL, NULL::integer, NULL;
        RETURN;
    END IF;
    SELECT * INTO refusal
    FROM admit_jobs(p_organization_id, p_kinds, p_kind_quotas, p_org_quota, false);
    IF FOUND THEN
        RETURN QUERY SELECT 'over_quota', standing.role, standing.state, NULL::uuid, NULL::uuid,
            NULL::uuid, NULL, NULL, NULL::integer, NULL::integer, NULL::jsonb, NULL, NULL, NULL,
            NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
            NULL::timestamptz, NULL::timestamptz, NULL, NULL::timestamptz, NULL::timestamptz,
            NULL::jsonb, refusal.refused_kind, refusal.cap, NULL;
        RETURN;
    END IF;
    -- The batch's sequences, one lock each in one order (see submit_job()).
    FOR sequence_lock IN
        SELECT DISTINCT hashtext('spacejobs.sequence:' || p_organization_id::text || ':' || k.key)
        FROM unnest(p_sequence_keys) AS k (key) WHERE k.key IS NOT NULL ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(sequence_lock);
    END LOOP;
    RETURN QUERY
    WITH made AS (
        INSERT INTO jobs AS j (id, organization_id, requested_by, kind, params, max_attempts,
                               lease_seconds, dedup_key, request_id, run_after, priority,
                               traceparent, sequence_key, sequence_position)
        SELECT n.id, p_organization_id, p_requested_by, n.kind, n.params,
               least(greatest(n.max_attempts, 1), 100), least(greatest(n.lease_seconds, 1), 86400),
               n.dedup_key, p_request_id, coalesce(n.run_after, now()), coalesce(n.priority, 0),
               p_traceparent, n.sequence_key,
               -- taken row by row in the batch's order (the subquery's), so places follow it
               CASE WHEN n.sequence_key IS NOT NULL THEN nextval('job_sequence_positions') END
        FROM (SELECT u.* FROM unnest(p_ids, p_kinds, p_params, p_max_attempts, p_lease_seconds,
                                     p_dedup_keys, p_run_afters, p_priorities,
                                     coalesce(p_sequence_keys,
                                              array_fill(NULL::text,
                                                         ARRAY[cardinality(p_ids)])))
                  WITH ORDINALITY AS u (id, kind, params, max_attempts, lease_seconds,
                                        dedup_key, run_after, priority, sequence_key, ord)
              ORDER BY u.ord) AS n
        ON CONFLICT DO NOTHING
        RETURNING j.*
    ), audited AS (
        -- Who started each, for the organization's audit log (as in submit_job()).
        INSERT INTO org_audit (organization_id, actor_id, actor, action, job_id, detail,
                               request_id)
        SELECT p_organization_id, coalesce(app_user(), p_requested_by),
               coalesce(app_actor(), 'user:' || p_requested_by), 'job.submit', made.id,
               jsonb_build_object('kind', made.kind, 'bulk', true), p_request_id
        FROM made
    )
    SELECT 'created', standing.role, standing.state, made.id, made.organization_id,
        made.requested_by, made.kind, made.status, made.attempts, made.max_attempts,
        made.progress, made.error_code, made.error_message, made.dedup_key, made.run_after,
        made.created_at, made.updated_at, made.started_at, made.finished_at,
        made.cancel_requested_at, made.leased_by, made.lease_until, made.result_expired_at,
        made.params, NULL, NULL::integer, made.sequence_key
    FROM made;
END $$;
REVOKE ALL ON FUNCTION submit_jobs(uuid, uuid, text[], text, text, uuid[], text[], jsonb[],
                                   integer[], integer[], text[], timestamptz[], integer, integer[],
                                   integer[], text, text[])
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION submit_jobs(uuid, uuid, text[], text, text, uuid[], text[], jsonb[],
                                      integer[], integer[], text[], timestamptz[], integer,
                                      integer[], integer[], text, text[])
    TO space_app, space_worker;

-- The one writer of job_rate_limits: the limit of one kind in one organization, or (p_max_starts
-- NULL) none, so the kind's own applies again. The owner's alone: the CLI calls it as the owner,
-- the dashboard through set_rate_limit().
CREATE FUNCTION put_rate_limit(p_organization_id uuid, p_kind text, p_max_starts integer,
                               p_per_seconds integer)
RETURNS void LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    IF p_max_starts IS NULL THEN
        DELETE FROM job_rate_limits r
        WHERE r.organization_id = p_organization_id AND r.kind = p_kind;
    ELSE
        INSERT INTO job_rate_limits (organization_id, kind, max_starts, per_seconds)
        VALUES (p_organization_id, p_kind, p_max_starts, p_per_seconds)
        ON CONFLICT (organization_id, kind) DO UPDATE
        SET max_starts = excluded.max_starts, per_seconds = excluded.per_seconds,
            updated_at = now();
    END IF;
END $$;
REVOKE ALL ON FUNCTION put_rate_limit(uuid, text, integer, integer) FROM PUBLIC;

-- An operator's rate limit from the dashboard (which runs as space_app, like the other operator
-- actions): it checks that the caller names an operator, and writes the operator audit line in
-- the same transaction.
CREATE FUNCTION set_rate_limit(p_operator_id uuid, p_organization_id uuid, p_kind text,
                               p_max_starts integer, p_per_seconds integer, p_request_id text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM users u WHERE u.id = p_operator_id AND u.is_operator) THEN
        RAISE EXCEPTION 'only an operator sets rate limits' USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM put_rate_limit(p_organization_id, p_kind, p_max_starts, p_per_seconds);
    INSERT INTO operator_audit (operator_id, action, target, detail, request_id)
    VALUES (p_operator_id, 'rate_limit', p_organization_id::text,
            jsonb_build_object('kind', p_kind, 'max_starts', p_max_starts,
                               'per_seconds', p_per_seconds),
            p_request_id);
END $$;
REVOKE ALL ON FUNCTION set_rate_limit(uuid, uuid, text, integer, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION set_rate_limit(uuid, uuid, text, integer, integer, text) TO space_app;
