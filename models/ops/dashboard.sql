-- Operator queries. They run as space_operator, whose column grants leave out params, result
-- and the lease token: none of these could select them even by mistake.

-- kinds_overview --
SELECT kind,
       count(*) FILTER (WHERE status = 'queued')            AS queued,
       count(*) FILTER (WHERE status = 'leased')            AS leased,
       count(*) FILTER (WHERE status = 'cancel_requested')  AS cancel_requested,
       count(*) FILTER (WHERE status = 'waiting')           AS waiting,
       count(*) FILTER (WHERE status = 'completed' AND finished_at > now() - interval '1 hour') AS completed_1h,
       count(*) FILTER (WHERE status = 'failed' AND finished_at > now() - interval '1 hour')    AS failed_1h,
       count(*) FILTER (WHERE status = 'cancelled' AND finished_at > now() - interval '1 hour') AS cancelled_1h,
       extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'queued' AND run_after <= now()))
           AS oldest_queued_seconds,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at))
           FILTER (WHERE status = 'completed' AND finished_at > now() - interval '1 hour') AS duration_p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at))
           FILTER (WHERE status = 'completed' AND finished_at > now() - interval '1 hour') AS duration_p95,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at))
           FILTER (WHERE started_at > now() - interval '1 hour') AS wait_p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at))
           FILTER (WHERE started_at > now() - interval '1 hour') AS wait_p95
FROM jobs
WHERE status IN {ACTIVE}
   OR finished_at > now() - interval '1 hour' OR started_at > now() - interval '1 hour'
GROUP BY kind
ORDER BY kind

-- waiting_by_kind --
-- Waiting jobs per kind, by what they wait for: a signal (with or without a deadline), their
-- children, else a timer. Never the signal's name: it is the kind author's word, not ours.
-- A waiting row is written by nothing until its wait ends, so updated_at is when it began.
-- "due": its moment has passed and the sweeper has not resumed it yet (a lasting number
-- means no sweeper is running).
SELECT kind,
       count(*) AS waiting,
       count(*) FILTER (WHERE wait_signal IS NULL AND wait_children IS NULL) AS timer,
       count(*) FILTER (WHERE wait_signal IS NOT NULL)                       AS signal,
       count(*) FILTER (WHERE wait_signal IS NULL AND wait_children IS NOT NULL) AS children,
       count(*) FILTER (WHERE wait_until <= now())                           AS due,
       min(updated_at) AS oldest_since,
       CAST(extract(epoch FROM now() - min(updated_at)) AS float8) AS oldest_seconds
FROM jobs
WHERE status = 'waiting'
GROUP BY kind
ORDER BY kind

-- finished_per_minute --
-- The last hour per kind and minute, for the dashboard's chart.
SELECT kind, date_trunc('minute', finished_at) AS minute,
       count(*) FILTER (WHERE status = 'completed') AS completed,
       count(*) FILTER (WHERE status = 'failed')    AS failed
FROM jobs
WHERE finished_at > now() - interval '1 hour'
GROUP BY kind, minute
ORDER BY kind, minute

-- list_jobs --
SELECT id, organization_id, requested_by, kind, status, attempts, max_attempts, leased_by,
       lease_until, extract(epoch FROM lease_until - now()) AS lease_left_seconds,
       run_after, error_code, error_message, created_at, started_at, finished_at, retry_of,
       request_id, progress
FROM jobs
WHERE (CAST(:kind AS text) IS NULL OR kind = :kind)
  AND (CAST(:status AS text) IS NULL OR status = :status)
  AND (CAST(:organization_id AS uuid) IS NULL OR organization_id = :organization_id)
  AND (CAST(:since AS timestamptz) IS NULL OR created_at >= :since)
  AND (NOT :running_only OR status IN {RUNNING})
  AND (NOT :expired_only OR (status IN {RUNNING} AND lease_until < now()))
ORDER BY created_at DESC, id DESC
LIMIT :limit

-- job_detail --
SELECT id, organization_id, requested_by, kind, status, attempts, max_attempts, leased_by,
       lease_until, run_after, progress, error_code, error_message, dedup_key, request_id,
       retry_of, created_at, updated_at, started_at, finished_at, cancel_requested_at,
       cancel_requested_by, result_expired_at,
       -- what it waits for, the signal's name left out (the kind author's word)
       wait_until, wait_signal IS NOT NULL AS waits_for_signal, wait_children
FROM jobs WHERE id = :id

-- job_events --
SELECT from_status, to_status, attempt, actor, at FROM job_events WHERE job_id = :id ORDER BY id

-- job_diagnostics --
SELECT attempt, worker, exception_class, traceback, at FROM job_diagnostics
WHERE job_id = :id ORDER BY id

-- workers --
SELECT id, node, hostname, pid, version, queues, kinds, concurrency, running, processed, failed,
       started_at, last_seen_at, stopped_at,
       (stopped_at IS NULL AND last_seen_at > now() - :offline_after * interval '1 second') AS online
FROM worker_processes
WHERE last_seen_at > now() - interval '1 day'
ORDER BY node, id

-- kind_settings --
SELECT kind, paused, concurrency_limit, updated_at, updated_by FROM kind_settings ORDER BY kind

-- audit --
SELECT a.at, a.action, a.target, a.detail, u.email AS operator
FROM operator_audit a JOIN users u ON u.id = a.operator_id
ORDER BY a.at DESC LIMIT :limit

-- job_organization --
SELECT organization_id FROM jobs WHERE id = :id

-- rate_limits --
-- The operators' rate limits per organization and kind, and each organization's claim weight
-- (its share of busy time); a kind's own declared limit is in its code, not here.
SELECT r.organization_id, o.name AS organization, r.kind, r.max_starts, r.per_seconds,
       o.claim_weight, r.updated_at
FROM job_rate_limits r JOIN organizations o ON o.id = r.organization_id
ORDER BY o.name, r.kind
