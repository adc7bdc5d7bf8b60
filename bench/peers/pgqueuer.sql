-- What the benchmark reads from PgQueuer's own tables (pgqueuer, pgqueuer_log), from a
-- connection of its own; the statements PostgresPeer (base.py) expects of every such peer.

-- waiting_count --
SELECT count(*) FROM pgqueuer WHERE status = 'queued'

-- finished_count --
SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'

-- workers_ready --
-- A worker connects, checks the schema and LISTENs, then dequeues: within a second here.
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'bench-peer-pgqueuer-worker'

-- outcome --
-- The dequeue statement logs a `picked` row per job it claims, a status-buffer flush a
-- `successful` one, and a finished job's queue row is deleted: anomalies are log rows in any
-- other status and rows left in the queue.
SELECT count(*) FILTER (WHERE status = 'picked'),
       count(*) FILTER (WHERE status = 'successful'),
       count(DISTINCT job_id) FILTER (WHERE status = 'successful'),
       count(*) FILTER (WHERE status NOT IN ('queued', 'picked', 'successful'))
         + (SELECT count(*) FROM pgqueuer),
       min(created) FILTER (WHERE status = 'picked'),
       max(created) FILTER (WHERE status = 'successful')
FROM pgqueuer_log

-- latencies --
-- Per job, seconds from the enqueue statement to the flush that logged it successful, and to
-- the dequeue that picked it.
SELECT extract(epoch FROM done.created - queued.created),
       extract(epoch FROM picked.created - queued.created)
FROM pgqueuer_log queued
JOIN pgqueuer_log done ON done.job_id = queued.job_id AND done.status = 'successful'
JOIN pgqueuer_log picked ON picked.job_id = queued.job_id AND picked.status = 'picked'
WHERE queued.status = 'queued'
