-- The hot path, revision 0004: one trigger call per STATEMENT instead of per row, so a batch of
-- claims or finishes writes its events and metric rows in one INSERT each; the standing check
-- for a whole batch in one call; and a NOTIFY when jobs are inserted.

-- The histogram bucket of a value as a plain CASE: an SQL function made of one expression is
-- inlined into the statement that calls it, where the 0003 version (a sub-select over
-- metric_buckets()) ran as a function call per row and per metric, the most expensive part of
-- a batch's trigger. The bounds are metric_buckets()'s, which a test checks one by one.
CREATE OR REPLACE FUNCTION metric_bucket(seconds double precision) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN seconds IS NULL THEN NULL
        WHEN seconds <= 0.005 THEN '0.005' WHEN seconds <= 0.01 THEN '0.01'
        WHEN seconds <= 0.025 THEN '0.025' WHEN seconds <= 0.05 THEN '0.05'
        WHEN seconds <= 0.1 THEN '0.1' WHEN seconds <= 0.25 THEN '0.25'
        WHEN seconds <= 0.5 THEN '0.5' WHEN seconds <= 1 THEN '1'
        WHEN seconds <= 2.5 THEN '2.5' WHEN seconds <= 5 THEN '5'
        WHEN seconds <= 10 THEN '10' WHEN seconds <= 30 THEN '30'
        WHEN seconds <= 60 THEN '60' WHEN seconds <= 300 THEN '300'
        WHEN seconds <= 1800 THEN '1800'
        ELSE '+Inf' END
$$;

DROP TRIGGER jobs_record_event ON jobs;
DROP FUNCTION jobs_record_event();
DROP TRIGGER jobs_count_metrics ON jobs;
DROP FUNCTION jobs_count_metrics();

-- Inserted jobs: their 'queued' events, and one NOTIFY per statement for workers that LISTEN
-- (a wake-up faster than the broker's; the broker's wake-up and the sweeper remain the
-- guarantee, NOTIFY is only a shortcut). The actor defaults to the requester.
-- SECURITY DEFINER: job_events is written by this function only, whoever inserted the job.
CREATE FUNCTION jobs_after_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO job_events (job_id, organization_id, from_status, to_status, attempt, actor)
    SELECT n.id, n.organization_id, NULL, n.status, n.attempts,
           coalesce(nullif(current_setting('app.actor', true), ''), 'user:' || n.requested_by)
    FROM new_jobs n;
    IF FOUND THEN
        PERFORM pg_notify('spacejobs_jobs', '');
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_after_insert AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_after_insert();

-- Updated jobs: an event per status change (and per re-lease after expiry, which is a new
-- attempt), and the metric events, summed per statement: a batch of 100 finishes adds one
-- 'finished' row with value 100, not 100 rows.
CREATE FUNCTION jobs_after_update() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
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
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_after_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_after_update();

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
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    WITH held AS (
        SELECT j.id, j.organization_id, j.requested_by
        FROM unnest(p_ids, p_tokens) AS l (id, token)
        JOIN jobs j ON j.id = l.id AND j.lease_token = l.token
                   AND j.status IN ('leased', 'cancel_requested')
        WHERE j.id = ANY (p_ids)
    ), standing AS (
        SELECT m.organization_id, m.user_id, m.role, o.state
        FROM memberships m JOIN organizations o ON o.id = m.organization_id
        WHERE (m.organization_id, m.user_id) IN (SELECT organization_id, requested_by FROM held)
        FOR SHARE OF m, o
    )
    SELECT h.id, s.role, s.state
    FROM held h
    JOIN standing s ON s.organization_id = h.organization_id AND s.user_id = h.requested_by
$$;
REVOKE ALL ON FUNCTION lease_standing(uuid[], uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION lease_standing(uuid[], uuid[]) TO space_worker;

-- A limited kind's running jobs are counted through the lease-expiry index (running jobs are
-- few: workers x their batch), so this extra index only cost every claim and finish a write.
DROP INDEX jobs_running_kind_idx;
