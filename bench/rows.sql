-- What the benchmarks read from a Space Jobs database for their figures (bench/rows.py): the
-- job rows and the events their triggers wrote, never the workers' logs. Each statement reads
-- one organization's jobs when :org is given, and every job in the database when it is NULL
-- (bench.throughput empties the tables between figures; bench.hosts gives each phase an
-- organization of its own).

-- progress --
-- Polled while jobs drain (bench.profile polls it every 0.2 s, so it stays one cheap statement
-- in the pg_stat_statements report it prints).
SELECT count(*) FILTER (WHERE status = 'queued') AS queued,
       count(*) FILTER (WHERE status = 'completed') AS completed,
       min(started_at) AS first_started,
       max(finished_at) AS last_finished
FROM jobs
WHERE CAST(:org AS uuid) IS NULL OR organization_id = CAST(:org AS uuid)

-- outcome --
-- Each job exactly once: completed in its first attempt, and its events exactly
-- queued > leased > completed (a batch given back unstarted, a second lease or a failure would
-- show as another chain). Two spans: the rows' (created_at, started_at and finished_at, which
-- hold their transactions' start) and the events' (first lease to last completion, stamped
-- with clock_timestamp() inside the statement that made the change).
WITH scoped AS (
    SELECT * FROM jobs WHERE CAST(:org AS uuid) IS NULL OR organization_id = CAST(:org AS uuid)
), chains AS (
    SELECT job_id,
           array_agg(to_status ORDER BY id) AS statuses,
           min(at) FILTER (WHERE to_status = 'leased') AS leased_at,
           max(at) FILTER (WHERE to_status = 'completed') AS completed_at
    FROM job_history
    WHERE CAST(:org AS uuid) IS NULL OR organization_id = CAST(:org AS uuid)
    GROUP BY job_id
), totals AS (
    SELECT count(*) AS jobs,
           count(*) FILTER (WHERE status = 'completed') AS completed,
           count(*) FILTER (WHERE attempts = 1) AS single_attempt,
           count(*) FILTER (WHERE status = 'completed' AND attempts = 1) AS completed_once,
           count(*) FILTER (WHERE created_at <= started_at AND started_at <= finished_at)
               AS ordered_times,
           min(created_at) AS first_created, max(created_at) AS last_created,
           min(started_at) AS first_started, max(finished_at) AS last_finished
    FROM scoped
)
SELECT totals.*,
       (SELECT count(*) FROM chains WHERE statuses = ARRAY['queued', 'leased', 'completed'])
           AS clean_chains,
       (SELECT count(*) FROM job_diagnostics
        WHERE CAST(:org AS uuid) IS NULL OR organization_id = CAST(:org AS uuid)) AS diagnostics,
       (SELECT min(leased_at) FROM chains) AS first_leased,
       (SELECT max(completed_at) FROM chains) AS last_completed
FROM totals

-- claims_by_actor --
-- Which pool processes took part (the lease event's actor names the process).
SELECT actor, count(*) AS jobs FROM job_history
WHERE to_status = 'leased'
  AND (CAST(:org AS uuid) IS NULL OR organization_id = CAST(:org AS uuid))
GROUP BY actor ORDER BY actor

-- row_latencies --
-- Per completed job, seconds from its row's created_at to its finished_at (both the start of
-- their transactions).
SELECT extract(epoch FROM finished_at - created_at) AS finished
FROM jobs
WHERE status = 'completed'
  AND (CAST(:org AS uuid) IS NULL OR organization_id = CAST(:org AS uuid))

-- event_latencies --
-- Per job, seconds from its row's created_at (the submitting transaction's start) to its
-- completion in its history, and to its lease: a stored event is stamped in the statement that
-- made the change, a completion its row holds at its finished_at (its transaction's start).
SELECT extract(epoch FROM done.at - j.created_at) AS finished,
       extract(epoch FROM leased.at - j.created_at) AS started
FROM jobs j
JOIN job_history done ON done.job_id = j.id AND done.to_status = 'completed'
JOIN job_history leased ON leased.job_id = j.id AND leased.to_status = 'leased'
WHERE CAST(:org AS uuid) IS NULL OR j.organization_id = CAST(:org AS uuid)

-- leased_count --
SELECT count(*) FROM job_history WHERE to_status = 'leased'

-- completion_events --
SELECT job_id, at FROM job_history WHERE to_status = 'completed'

-- lone_wait --
-- The lone organization's job: seconds from its row's created_at to its lease event, and how
-- many of the flood's jobs were still to be leased at that moment (more than none: it arrived
-- mid-flood). The flood's drain rate spans its first lease to its last completion.
WITH lone AS (
    SELECT j.created_at, e.at AS leased_at
    FROM jobs j JOIN job_history e ON e.job_id = j.id AND e.to_status = 'leased'
    WHERE j.organization_id = :lone
), flood AS (
    SELECT e.job_id, e.to_status, e.at
    FROM job_history e JOIN jobs j ON j.id = e.job_id
    WHERE j.organization_id <> :lone AND e.to_status IN ('leased', 'completed')
)
SELECT extract(epoch FROM lone.leased_at - lone.created_at) AS wait_s,
       (SELECT count(*) FROM flood WHERE flood.to_status = 'leased' AND flood.at > lone.leased_at)
           AS flood_left,
       (SELECT count(*) FROM flood WHERE flood.to_status = 'completed') AS flood_jobs,
       extract(epoch FROM (SELECT max(at) FROM flood WHERE to_status = 'completed')
                          - (SELECT min(at) FROM flood WHERE to_status = 'leased')) AS flood_s
FROM lone
