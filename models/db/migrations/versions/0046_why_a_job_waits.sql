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
