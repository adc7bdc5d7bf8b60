-- Revision 0056: no index of every organization's queued jobs by run_after (issue 32).
--
-- jobs_claimable_idx (run_after, created_at) WHERE status = 'queued' held every organization's
-- queued jobs in one order. A generic plan of claim_jobs(), which the planner keeps for the
-- session, read it in place of jobs_fair_claim_idx from each key's head (both looked like one
-- row), through every organization's jobs to find one's: in a hold at 200 jobs/s over 4
-- organizations, 1,111 entries a scan and 326 scans a second, each entry a heap fetch. Its
-- other readers, the oldest due job's age (/metrics, a worker's liveness check), walked it from
-- its beginning, where a long-open transaction keeps every job queued since it began. They read
-- from the claim's heads now (due_queue_ages(), oldest_due()), and a job's life writes one index
-- entry less (78 bytes of WAL, bench.cost).

DROP INDEX jobs_claimable_idx;

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
