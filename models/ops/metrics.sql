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
WHERE status IN {ACTIVE}
GROUP BY kind, status

-- oldest_due_wait --
-- Waiting jobs whose moment has passed but that are not queued again yet: the sweeper resumes
-- them within a sweep interval, so an age that keeps growing means no sweeper is running.
SELECT kind, extract(epoch FROM now() - min(wait_until)) AS age FROM jobs
WHERE status = 'waiting' AND wait_until <= now() GROUP BY kind

-- oldest_queued --
-- Read from the claim's heads (see due_queue_ages() in the schema).
SELECT a.kind, extract(epoch FROM now() - a.oldest_created_at) AS age FROM due_queue_ages() AS a

-- workers_online --
SELECT count(*) FROM worker_processes
WHERE stopped_at IS NULL AND last_seen_at > now() - :offline_after * interval '1 second'
