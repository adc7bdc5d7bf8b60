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
-- With the organization's name and the requester's email beside their ids (an operator reads
-- names; the ids stay for the API and for logs), and the parent, so that a workflow's or a
-- fan-out's steps can be shown under it.
SELECT j.id, j.organization_id, o.name AS organization, j.requested_by, u.email AS requester,
       j.kind, j.status, j.attempts, j.max_attempts, j.leased_by,
       j.lease_until, extract(epoch FROM j.lease_until - now()) AS lease_left_seconds,
       j.run_after, j.error_code, j.error_message, j.created_at, j.started_at, j.finished_at,
       j.retry_of, j.request_id, j.progress, j.parent_id, j.child_index
FROM jobs j
LEFT JOIN organizations o ON o.id = j.organization_id
LEFT JOIN users u ON u.id = j.requested_by
WHERE (CAST(:kind AS text) IS NULL OR j.kind = :kind)
  AND (CAST(:status AS text) IS NULL OR j.status = :status)
  AND (CAST(:organization_id AS uuid) IS NULL OR j.organization_id = :organization_id)
  AND (CAST(:since AS timestamptz) IS NULL OR j.created_at >= :since)
  AND (NOT :running_only OR j.status IN {RUNNING})
  AND (NOT :expired_only OR (j.status IN {RUNNING} AND j.lease_until < now()))
ORDER BY j.created_at DESC, j.id DESC
LIMIT :limit

-- organizations --
-- For the operators' pickers (rate limits, the jobs filter): names, never typed UUIDs.
SELECT id, name, state FROM organizations ORDER BY name, id

-- job_detail --
SELECT id, organization_id, (SELECT name FROM organizations o WHERE o.id = j.organization_id) AS organization,
       requested_by, (SELECT email FROM users u WHERE u.id = j.requested_by) AS requester, kind, status, attempts, max_attempts, leased_by,
       lease_until, run_after, progress, error_code, error_message, dedup_key, request_id,
       retry_of, created_at, updated_at, started_at, finished_at, cancel_requested_at,
       cancel_requested_by, result_expired_at,
       -- what it waits for, the signal's name left out (the kind author's word)
       wait_until, wait_signal IS NOT NULL AS waits_for_signal, wait_children
FROM jobs j WHERE id = :id

-- job_events --
SELECT from_status, to_status, attempt, actor, at FROM job_history WHERE job_id = :id ORDER BY id

-- job_diagnostics --
SELECT attempt, worker, exception_class, traceback, at FROM job_diagnostics
WHERE job_id = :id ORDER BY id

-- workers --
-- Reconciled: a process that stopped or went silent runs nothing any more, whatever its last
-- heartbeat said (a SIGKILLed process never says running 0; its job comes back through the
-- lease). Aged out: a stopped process is shown for :stopped_shown seconds, a silent one for
-- :offline_shown seconds, then no more (each restart of a worker adds new processes).
SELECT id, node, hostname, pid, version, queues, kinds, concurrency,
       CASE WHEN online THEN running ELSE 0 END AS running,
       CASE WHEN online THEN concurrency ELSE 0 END AS slots,
       processed, failed, started_at, last_seen_at, stopped_at, online,
       CAST(extract(epoch FROM now() - last_seen_at) AS float8) AS silent_seconds
FROM (SELECT *, (stopped_at IS NULL AND last_seen_at > now() - :offline_after * interval '1 second')
                AS online
      FROM worker_processes
      WHERE coalesce(stopped_at, last_seen_at) > now() - :offline_shown * interval '1 second'
        AND (stopped_at IS NULL OR stopped_at > now() - :stopped_shown * interval '1 second')) w
ORDER BY online DESC, node, started_at, id

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
