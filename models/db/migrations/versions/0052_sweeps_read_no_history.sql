-- Revision 0052: the sweeps read no history (issue 32).
--
-- Behind a transaction left open, two of beat's sweeps read from the beginning of an index that
-- keeps an entry for every job since it began: sweep_expired_leases() walked
-- jobs_lease_expiry_idx through the lease of every job finished since, and sweep_unsignalled()
-- walked jobs_claimable_idx through every job queued since, each run (every 5 s). At 200 jobs a
-- second, 12,000 entries more a minute for each, read every run by a beat that shares the
-- database's CPU with the claim.
-- The expired leases are now read from a horizon the run before left on
-- (expired_leases_horizon(): the earliest lease then held, a minute back), and the due jobs
-- nobody signalled from each key's claim head, as the claim reads them. The one-argument
-- sweep_expired_leases() stays for the previous release's beat.

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
CREATE OR REPLACE FUNCTION sweep_expired_leases(p_batch integer) RETURNS TABLE (id uuid, status text)
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT s.id, s.status FROM sweep_expired_leases(p_batch, '-infinity') AS s
$$;
REVOKE ALL ON FUNCTION sweep_expired_leases(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION sweep_expired_leases(integer) TO space_worker;

CREATE FUNCTION expired_leases_horizon(p_from timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT least(now(), (SELECT min(e.lease_until) FROM jobs e
                         WHERE e.status IN ('leased', 'cancel_requested')
                           AND e.lease_until >= p_from))
           - interval '1 minute'
$$;
REVOKE ALL ON FUNCTION expired_leases_horizon(timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION expired_leases_horizon(timestamptz) TO space_worker;

CREATE OR REPLACE FUNCTION sweep_unsignalled(p_grace double precision, p_batch integer)
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
