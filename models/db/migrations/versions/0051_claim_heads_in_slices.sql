-- Revision 0051: the claim heads' chore visits a slice of the organizations a run (issue 32).
--
-- advance_claim_heads() took its exclusive lock, which every submit of a claimable job waits
-- for, for as long as it took to look at every organization's heads: with thousands of
-- organizations a submit waited that long each second. A run now visits at most p_orgs
-- organizations round the claim's ring from just after p_after, finds each key by one probe
-- (claim_ring(), claim_levels()) instead of walking every version a long-open transaction
-- keeps, and answers the last organization it visited; the chore goes on from there next run.
-- The two-argument function stays for the previous release's beat: every organization a run.
-- No JIT for the move: the planner's guess of the keys passed jit_above_cost, and LLVM compiled
-- the statement for 340 ms of a 385 ms run.

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
CREATE OR REPLACE FUNCTION advance_claim_heads(p_lag interval, p_idle interval) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT a.moved FROM advance_claim_heads(p_lag, p_idle, NULL, 1000000000) AS a
$$;
REVOKE ALL ON FUNCTION advance_claim_heads(interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION advance_claim_heads(interval, interval) TO space_worker;
