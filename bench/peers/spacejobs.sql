-- What the benchmark reads from (and clears in) a Space Jobs database, as the owner role
-- (tests/kit Stack.admin), for bench/peers/spacejobs.py. Every figure is read here: the job
-- rows and the events their triggers wrote, never the workers' logs.

-- clear --
-- Between figures, so each reads only its own rows (jobs_after_truncate empties job_events;
-- job_diagnostics goes with its jobs); the metric rows go too, or the triggers' table would
-- grow through the run for Space Jobs alone.
TRUNCATE jobs, metric_events CASCADE

-- queued_count --
SELECT count(*) FROM jobs WHERE status = 'queued'

-- completed_count --
SELECT count(*) FROM jobs WHERE status = 'completed'

-- outcome --
-- Each job exactly once: completed in its first attempt, and its events exactly
-- queued > leased > completed (a batch given back unstarted, a second lease or a failure would
-- show as another chain). The span runs from the first lease event to the last completion
-- event: events are stamped with clock_timestamp() inside the statement that made the change,
-- where the rows' started_at / finished_at hold their transaction's start.
WITH chains AS (
    SELECT job_id,
           array_agg(to_status ORDER BY id) AS statuses,
           min(at) FILTER (WHERE to_status = 'leased') AS leased_at,
           max(at) FILTER (WHERE to_status = 'completed') AS completed_at
    FROM job_events GROUP BY job_id
)
SELECT (SELECT count(*) FROM jobs) AS jobs,
       (SELECT count(*) FROM jobs WHERE status = 'completed' AND attempts = 1) AS completed_once,
       count(*) FILTER (WHERE statuses = ARRAY['queued', 'leased', 'completed']) AS clean_chains,
       (SELECT count(*) FROM job_diagnostics) AS diagnostics,
       min(leased_at) AS first_leased,
       max(completed_at) AS last_completed
FROM chains

-- claims_by_worker --
-- Which pool processes took part (the lease event's actor names the process).
SELECT actor, count(*) AS jobs FROM job_events WHERE to_status = 'leased' GROUP BY actor ORDER BY actor

-- latencies --
-- Per job, seconds from its row's created_at (the submitting transaction's start) to the event
-- of its completion (in the finishing statement, just before its COMMIT), and to its lease.
SELECT extract(epoch FROM done.at - j.created_at) AS finished,
       extract(epoch FROM leased.at - j.created_at) AS started
FROM jobs j
JOIN job_events done ON done.job_id = j.id AND done.to_status = 'completed'
JOIN job_events leased ON leased.job_id = j.id AND leased.to_status = 'leased'

-- created_span --
-- The web figure's jobs: how many rows the POSTs made, and over how long.
SELECT count(*) AS jobs, min(created_at) AS first_created, max(created_at) AS last_created
FROM jobs WHERE organization_id = :org

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

-- leased_events --
SELECT count(*) FROM job_events WHERE to_status = 'leased'

-- lone_wait --
-- The lone organization's job: seconds from its row's created_at to its lease event, and how
-- many of the flood's jobs were still to be leased at that moment (more than none: it arrived
-- mid-flood). The flood's drain rate spans its first lease to its last completion.
WITH lone AS (
    SELECT j.created_at, e.at AS leased_at
    FROM jobs j JOIN job_events e ON e.job_id = j.id AND e.to_status = 'leased'
    WHERE j.organization_id = :lone
), flood AS (
    SELECT e.job_id, e.to_status, e.at
    FROM job_events e JOIN jobs j ON j.id = e.job_id
    WHERE j.organization_id <> :lone AND e.to_status IN ('leased', 'completed')
)
SELECT extract(epoch FROM lone.leased_at - lone.created_at) AS wait_s,
       (SELECT count(*) FROM flood WHERE flood.to_status = 'leased' AND flood.at > lone.leased_at)
           AS flood_left,
       (SELECT count(*) FROM flood WHERE flood.to_status = 'completed') AS flood_jobs,
       extract(epoch FROM (SELECT max(at) FROM flood WHERE to_status = 'completed')
                          - (SELECT min(at) FROM flood WHERE to_status = 'leased')) AS flood_s
FROM lone

-- completion_events --
SELECT job_id, at FROM job_events WHERE to_status = 'completed'
