-- What bench.soak reads each minute (bench/soak.py): the tables' own statistics, as a
-- superuser or the owner, and the minute's jobs from their rows.

-- tables --
-- Cumulative counters (pg_stat_user_tables) and sizes of the two tables a steady load churns.
-- The counters are flushed by each backend at most once a second, so a minute's delta is
-- exact to about a second.
SELECT s.relname AS name, s.n_live_tup AS live, s.n_dead_tup AS dead,
       pg_total_relation_size(s.relid) AS bytes, s.autovacuum_count AS autovacuums,
       s.n_tup_upd AS updates, s.n_tup_hot_upd AS hot_updates, s.n_tup_del AS deletes
FROM pg_stat_user_tables s
WHERE s.relname IN ('jobs', 'job_events')

-- queued --
-- The queue's depth: due and queued (what a claim would take now).
SELECT count(*) FROM jobs WHERE status = 'queued'

-- finished_between --
-- End-to-end latency of the jobs that finished in a minute (by the database's clock), submit
-- (created_at, the submit's transaction start) to finish, in seconds.
SELECT extract(epoch FROM finished_at - created_at)::float8
FROM jobs
WHERE finished_at >= :since AND finished_at < :until AND status = 'completed'

-- now --
SELECT clock_timestamp()

-- probe_claim --
-- The claim the workers run (models/jobs/store.sql claim_batch), one job, in a transaction the
-- probe rolls back: it costs what a worker's claim costs at this moment (the same index scans,
-- the same dead entries to step over), and changes nothing.
SELECT count(id) FROM claim_jobs('soak-probe', 1, CAST('{}' AS text[]), CAST(NULL AS text),
                                 CAST('00000000-0000-0000-0000-000000000000' AS uuid))

-- report_read --
-- The reporting transaction's first read: a BI tool's count over the whole table. Its snapshot
-- is then held (REPEATABLE READ) until the transaction ends.
SELECT status, count(*) FROM jobs GROUP BY status
