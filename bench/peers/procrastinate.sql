-- What the benchmark reads from Procrastinate's own tables (procrastinate_jobs and the
-- procrastinate_events its triggers write), from a connection of its own; the statements
-- PostgresPeer (base.py) expects of every such peer.

-- clear --
-- Between figures: every job and event of the previous one, and the workers it registered.
TRUNCATE procrastinate_events, procrastinate_periodic_defers, procrastinate_jobs, procrastinate_workers

-- waiting_count --
SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'

-- finished_count --
SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'

-- workers_ready --
-- A worker registers itself, then LISTENs and fetches.
SELECT count(*) FROM procrastinate_workers

-- outcome --
-- Anomalies: events other than deferred/started/succeeded, jobs in another status.
SELECT count(*) FILTER (WHERE type = 'started'),
       count(*) FILTER (WHERE type = 'succeeded'),
       (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'),
       count(*) FILTER (WHERE type NOT IN ('deferred', 'started', 'succeeded'))
         + (SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'),
       min(at) FILTER (WHERE type = 'started'),
       max(at) FILTER (WHERE type = 'succeeded')
FROM procrastinate_events

-- latencies --
-- Per job, seconds from the defer statement to the finish statement, and to the fetch.
SELECT extract(epoch FROM done.at - deferred.at), extract(epoch FROM started.at - deferred.at)
FROM procrastinate_events deferred
JOIN procrastinate_events started ON started.job_id = deferred.job_id AND started.type = 'started'
JOIN procrastinate_events done ON done.job_id = deferred.job_id AND done.type = 'succeeded'
WHERE deferred.type = 'deferred'
