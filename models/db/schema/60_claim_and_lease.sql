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
    -- PL/pgSQL for its plan, kept for the session (see api_principal(), revision 0036).
    RETURN QUERY
    WITH held AS (
        SELECT j.id, j.organization_id, j.requested_by
        FROM unnest(p_ids, p_tokens) AS l (id, token)
        JOIN jobs j ON j.id = l.id AND j.lease_token = l.token
                   AND j.status IN ('leased', 'cancel_requested')
        WHERE j.id = ANY (p_ids)
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

-- The claim: up to p_limit due jobs in ONE statement, each with its own fresh random lease token,
-- fair between organizations: they are taken in turn around a ring (the caller remembers where
-- its last claim stopped), each a share of the batch in proportion to its weight, and within an
-- organization higher priority first. Every step reads an index (jobs_fair_claim_idx; leases
-- that ran out, jobs_lease_expiry_idx); SKIP LOCKED lets concurrent claimers pass each other.
-- A function, because it is the one place a worker reads params: those of the jobs it leases.
CREATE FUNCTION claim_jobs(p_worker text, p_limit integer, p_skip_kinds text[], p_only_kind text,
                           p_after_organization uuid)
RETURNS TABLE (id uuid, organization_id uuid, requested_by uuid, kind text, params jsonb,
               attempts integer, max_attempts integer, lease_token uuid, lease_seconds integer,
               request_id text, more_due boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
-- JIT compiled this short statement on every call once the queue was large (revision 0016).
-- Every read below has an index made for it, so no sequential or bitmap scan, and a plan of
-- those indexes does not depend on the statistics: one generic plan a session. Without this a
-- claim behind 1,000,000 finished rows took 80 ms instead of 1 (revision 0023).
SET jit = off SET enable_seqscan = off SET enable_bitmapscan = off
SET plan_cache_mode = force_generic_plan AS $$
BEGIN
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
        -- Each organization's share of the batch, in proportion to its weight (at least one).
        SELECT r.org, r.position, o.claim_weight AS weight,
               ceil(p_limit * o.claim_weight::numeric / sum(o.claim_weight) OVER ())::integer
                   AS share
        FROM ring r JOIN organizations o ON o.id = r.org
    ), queued AS (
        SELECT s.position, s.weight, c.ctid, c.priority, c.run_after, c.created_at
        FROM shares s CROSS JOIN LATERAL (
            SELECT q.ctid, q.priority, q.run_after, q.created_at FROM jobs q
            WHERE q.organization_id = s.org AND q.status = 'queued' AND q.run_after <= now()
              AND q.kind <> ALL (p_skip_kinds) AND (p_only_kind IS NULL OR q.kind = p_only_kind)
            ORDER BY q.priority DESC, q.run_after, q.created_at
            LIMIT s.share
            FOR UPDATE OF q SKIP LOCKED
        ) AS c
    ), interleaved AS (
        -- Round by round: each organization's next job(s), a weight of 2 taking two per round.
        SELECT i.ctid FROM (
            SELECT q.ctid, q.position,
                   row_number() OVER (PARTITION BY q.position
                                      ORDER BY q.priority DESC, q.run_after, q.created_at)
                       ::numeric / q.weight AS round
            FROM queued q
        ) AS i
        ORDER BY i.round, i.position
        LIMIT p_limit
    ), expired AS (
        -- A lease that ran out while attempts remain is claimable at once (the sweeper would
        -- otherwise requeue it a little later); cancel_requested is not: an expired cancel
        -- request ends cancelled, never retried.
        SELECT e.ctid FROM jobs e
        WHERE e.status = 'leased' AND e.lease_until < now() AND e.attempts < e.max_attempts
          AND e.kind <> ALL (p_skip_kinds) AND (p_only_kind IS NULL OR e.kind = p_only_kind)
        ORDER BY e.lease_until
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), chosen AS (
        SELECT c.ctid FROM (SELECT x.ctid FROM expired x UNION ALL SELECT y.ctid FROM interleaved y)
            AS c
        LIMIT p_limit
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
                  LIMIT p_limit + 1) AS due);
    IF NOT FOUND THEN
        -- Nothing taken: one row with no job says whether jobs were due all the same (locked
        -- by concurrent claimers for a moment), so the caller may try again instead of idling.
        RETURN QUERY SELECT NULL::uuid, NULL::uuid, NULL::uuid, NULL::text, NULL::jsonb,
                            NULL::integer, NULL::integer, NULL::uuid, NULL::integer, NULL::text,
                            EXISTS (SELECT 1 FROM jobs m
                                    WHERE m.status = 'queued' AND m.run_after <= now()
                                      AND m.kind <> ALL (p_skip_kinds)
                                      AND (p_only_kind IS NULL OR m.kind = p_only_kind));
    END IF;
END $$;
REVOKE ALL ON FUNCTION claim_jobs(text, integer, text[], text, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION claim_jobs(text, integer, text[], text, uuid) TO space_worker;
