-- What the database says about jobs: the facts tests assert on and chaos invariants judge.
-- Read as an application role (space_worker or space_operator read the whole queue), or as
-- the owner in a benchmark's own database; never written.

-- job_row --
SELECT * FROM jobs WHERE id = :id

-- job_events --
SELECT from_status, to_status, attempt, actor, at FROM job_history WHERE job_id = :id ORDER BY id

-- counts_by_status --
SELECT status, count(*) FROM jobs GROUP BY status

-- counts_by_status_in_organization --
SELECT status, count(*) FROM jobs WHERE organization_id = :org GROUP BY status

-- outcomes --
SELECT id::text, status, attempts, error_code FROM jobs

-- child_job_ids --
SELECT id::text FROM jobs WHERE parent_id IS NOT NULL

-- still_leased --
-- A finished or queued row holds no lease: a lease left behind means an attempt never ended.
SELECT count(*) FROM jobs
 WHERE status IN ('leased', 'cancel_requested') OR lease_until IS NOT NULL

-- finished_twice --
SELECT count(*) FROM (
    SELECT job_id FROM job_history WHERE to_status = 'completed' GROUP BY job_id HAVING count(*) > 1
) twice

-- broken_event_links --
-- Each event must start where the job's previous event ended (the first one from NULL).
SELECT count(*) FROM (
    SELECT from_status, lag(to_status) OVER w AS previous
      FROM job_history WINDOW w AS (PARTITION BY job_id ORDER BY id)
) e
 WHERE from_status IS DISTINCT FROM previous

-- status_disagrees_with_events --
SELECT count(*) FROM jobs j
 WHERE j.status IS DISTINCT FROM
       (SELECT e.to_status FROM job_history e WHERE e.job_id = j.id ORDER BY e.id DESC LIMIT 1)

-- expired_lease_takeovers --
-- A lease taken over by a worker shows as leased -> leased; one the sweeper ended or put back
-- as a sweeper event from leased or cancel_requested.
SELECT count(*) FILTER (WHERE from_status = 'leased' AND to_status = 'leased') AS relet,
       count(*) FILTER (WHERE actor = 'sweeper' AND from_status IN ('leased', 'cancel_requested'))
           AS swept
  FROM job_history

-- resignalled_by_sweeper --
-- last_wakeup_at is the submit time until the sweeper re-signals a job (NULL after a requeue
-- that nobody has signalled since).
SELECT count(*) FROM jobs WHERE last_wakeup_at > created_at

-- worker_claims --
SELECT actor, at FROM job_history WHERE to_status = 'leased' AND actor LIKE 'worker:%'

-- leased_jobs --
SELECT leased_by, id::text FROM jobs WHERE status = 'leased'

-- active_counts_off --
-- Owner only. The (organization, kind) pairs whose count in active_job_counts, which the jobs
-- and reservations triggers keep for the quota, is not the number of their active jobs and of
-- the children their parents reserved.
SELECT count(*) FROM (
    SELECT organization_id, kind, sum(active) AS n FROM active_job_counts
    GROUP BY organization_id, kind HAVING sum(active) <> 0) AS counted
FULL JOIN (
    SELECT a.organization_id, a.kind, sum(a.n) AS n FROM (
        SELECT organization_id, kind, count(*) AS n FROM jobs
        WHERE status IN ('queued', 'leased', 'cancel_requested', 'waiting')
        GROUP BY organization_id, kind
        UNION ALL
        SELECT organization_id, kind, sum(reserved) FROM job_reservations
        GROUP BY organization_id, kind) AS a
    GROUP BY a.organization_id, a.kind HAVING sum(a.n) <> 0) AS actual
    USING (organization_id, kind)
WHERE counted.n IS DISTINCT FROM actual.n

-- taken_over_between --
SELECT count(DISTINCT job_id) FROM job_history
 WHERE job_id::text = ANY(:ids)
   AND at BETWEEN to_timestamp(:began) AND to_timestamp(:ended)
   AND ((from_status = 'leased' AND to_status = 'leased')
        OR (actor = 'sweeper' AND from_status IN ('leased', 'cancel_requested')))
