-- What bench/peers/spacejobs.py writes into a Space Jobs database, as the owner role (tests/kit
-- Stack.admin): the clearing between figures and the claim cost's history. What it reads for
-- the figures is bench/rows.sql.

-- clear --
-- Between figures, so each reads only its own rows (jobs_after_truncate empties job_events;
-- job_diagnostics goes with its jobs); the metric rows go too, or the triggers' table would
-- grow through the run for Space Jobs alone.
TRUNCATE jobs, metric_events CASCADE

-- fill_finished --
-- Claim cost: history the claim must not read, written straight into the table as the owner
-- (as if retention had not run for a long time): completed jobs, one second apart.
INSERT INTO jobs (organization_id, requested_by, kind, status, lease_seconds, max_attempts,
                  attempts, result, run_after, created_at, updated_at, started_at, finished_at)
SELECT :org, :user, 'bench.noop', 'completed', 30, 3, 1, '{}', t, t, t, t,
       t + interval '5 milliseconds'
FROM (SELECT now() - g * interval '1 second' AS t FROM generate_series(1, :n) g) s

-- fill_queued --
INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds, max_attempts)
SELECT :org, :user, 'bench.noop', 30, 3 FROM generate_series(1, :n)

-- analyze --
ANALYZE jobs
