-- What bench.hold reads each minute from either system's database (bench/hold.py), over psycopg
-- as the superuser that created it: the tables' own statistics, and the minute's finished jobs
-- from each system's own rows.

-- tables --
-- Every table of the system's database, with its indexes and TOAST: dead row versions (as the
-- statistics last counted them: flushed by each backend at most once a second) and bytes.
SELECT coalesce(sum(s.n_dead_tup), 0)::bigint AS dead,
       coalesce(sum(pg_total_relation_size(s.relid)), 0)::bigint AS bytes
FROM pg_stat_user_tables s

-- now --
SELECT clock_timestamp()

-- spacejobs_finished_between --
-- Space Jobs: per job finished in the window (by the database's clock), submit (created_at,
-- its transaction's start) to finish (finished_at, stamped by the finishing statement).
SELECT extract(epoch FROM finished_at - created_at)::float8
FROM jobs
WHERE finished_at >= %(since)s AND finished_at < %(until)s AND status = 'completed'

-- pgqueuer_finished_between --
-- PgQueuer: per job logged successful in the window, its enqueue statement's `queued` row to
-- the status flush's `successful` row (pgqueuer_log, each stamped with its statement's now()).
SELECT extract(epoch FROM done.created - queued.created)::float8
FROM pgqueuer_log done
JOIN pgqueuer_log queued ON queued.job_id = done.job_id AND queued.status = 'queued'
WHERE done.status = 'successful' AND done.created >= %(since)s AND done.created < %(until)s

-- reader_session --
-- The benchmark's reading session on PgQueuer's database (hold.py says why).
SET enable_nestloop = off

-- pgqueuer_report_read --
-- The reporting transaction's first read on PgQueuer's database, as bench.soak's on Space
-- Jobs': a count over the queue. Its snapshot is then held (REPEATABLE READ) until it ends.
SELECT status, count(*) FROM pgqueuer GROUP BY status
