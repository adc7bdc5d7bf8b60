-- Revision 0063: the leases a worker hands back are joined to their rows by hash or one
-- primary-key probe each, never every row against every lease (issue 32, the drain's database
-- time).
--
-- extend_leases(), complete_jobs() and release_jobs() found the rows through the primary key
-- (id = ANY) and then joined them to the unnest of the leases given by nested loop: each row
-- read the whole list again and was compared with every lease, so a batch cost the square of
-- its size (a finish of 1,000 leases took about 200 us a job instead of 35; a heartbeat of
-- 1,000, 155 instead of 29). They now run with nested loops off, so the join is a hash join
-- over the rows the key found. lease_standing() also joins memberships and organizations, whose
-- probes want nested loops: its filter on the ids goes instead, and the plan probes the key
-- once per lease given (67 us a job at 1,000 leases, now 10). The answers are the same.
-- CREATE OR REPLACE keeps the functions' grants.


CREATE OR REPLACE FUNCTION lease_standing(p_ids uuid[], p_tokens uuid[])
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

CREATE OR REPLACE FUNCTION extend_leases(p_ids uuid[], p_tokens uuid[])
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

CREATE OR REPLACE FUNCTION complete_jobs(p_ids uuid[], p_tokens uuid[], p_results jsonb[], p_refs text[])
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

CREATE OR REPLACE FUNCTION release_jobs(p_ids uuid[], p_tokens uuid[]) RETURNS TABLE (id uuid)
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
