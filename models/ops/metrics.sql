-- What /metrics reads at scrape time, as space_operator. Labels are only kind and
-- status/outcome: never an organization or a job id.

-- metric_counters --
-- Folded counters plus the events the sweeper has not folded yet.
SELECT name, kind, label, sum(value) AS value FROM (
    SELECT name, kind, label, value FROM metric_counters
    UNION ALL
    SELECT name, kind, label, value FROM metric_events
) AS everything
GROUP BY name, kind, label

-- active_by_status --
SELECT kind, status, count(*) AS n FROM jobs
WHERE status IN ('queued', 'leased', 'cancel_requested')
GROUP BY kind, status

-- oldest_queued --
SELECT kind, extract(epoch FROM now() - min(created_at)) AS age FROM jobs
WHERE status = 'queued' AND run_after <= now() GROUP BY kind

-- workers_online --
SELECT count(*) FROM worker_processes
WHERE stopped_at IS NULL AND last_seen_at > now() - :offline_after * interval '1 second'
