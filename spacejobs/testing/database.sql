-- The test helpers' statements (spacejobs/testing/database.py), against an application's own
-- test database. Reads run as the caller's connection (the web role scoped to an organization
-- sees that organization's jobs; the owner sees every job); time is moved as the owner, the
-- only role that may write those columns; the resumes run as the worker, as beat's do.

-- submitted --
-- The jobs a test's application submitted, oldest first (a child of a fan-out or a workflow
-- only when asked for): the columns of models.jobs.records.Job, which every role may read.
SELECT id, organization_id, requested_by, kind, status, attempts, max_attempts, progress,
       error_code, error_message, dedup_key, run_after, created_at, updated_at, started_at,
       finished_at, cancel_requested_at, leased_by, lease_until, result_expired_at,
       wait_until, wait_signal, wait_children, sequence_key
FROM jobs
WHERE (CAST(:kind AS text) IS NULL OR kind = CAST(:kind AS text))
  AND (CAST(:org AS uuid) IS NULL OR organization_id = CAST(:org AS uuid))
  AND (CAST(:statuses AS text[]) IS NULL OR status = ANY (CAST(:statuses AS text[])))
  AND (CAST(:children AS boolean) OR parent_id IS NULL)
ORDER BY created_at, id

-- submitted_with_params --
-- The same, of the jobs whose params hold these (jsonb containment: the keys given, with
-- these values; the rest of the params is free). Reads params: the web role or the owner.
SELECT id, organization_id, requested_by, kind, status, attempts, max_attempts, progress,
       error_code, error_message, dedup_key, run_after, created_at, updated_at, started_at,
       finished_at, cancel_requested_at, leased_by, lease_until, result_expired_at,
       wait_until, wait_signal, wait_children, sequence_key
FROM jobs
WHERE (CAST(:kind AS text) IS NULL OR kind = CAST(:kind AS text))
  AND (CAST(:org AS uuid) IS NULL OR organization_id = CAST(:org AS uuid))
  AND (CAST(:statuses AS text[]) IS NULL OR status = ANY (CAST(:statuses AS text[])))
  AND (CAST(:children AS boolean) OR parent_id IS NULL)
  AND params @> CAST(:params AS jsonb)
ORDER BY created_at, id

-- job_row --
-- Every column of one job, as the owner (params, result and lease token included).
SELECT * FROM jobs WHERE id = :id

-- job_due --
-- Whether one job may be claimed now, and if not, why (as the owner).
SELECT status, run_after <= now() AS due, lease_until < now() AS lease_ran_out,
       wait_until, wait_signal, wait_children, organization_id
FROM jobs WHERE id = :id

-- results_of --
-- What the jobs a drain ran hold now (as the owner).
SELECT id, status, result FROM jobs WHERE id = ANY (CAST(:ids AS uuid[]))

-- hold_back --
-- One claim of the harness takes only one job, or one organization's: every other row a
-- claim could take is locked by the owner for the claim's length. The claim skips rows it
-- cannot lock (claim_jobs(): SKIP LOCKED), so it takes none of them, and nothing of them is
-- written. FOR NO KEY UPDATE: a row referencing one of them (a child, a step) is still written.
SELECT count(*) FROM (
    SELECT j.id FROM jobs j
    WHERE j.status IN ('queued', 'leased')
      AND (CAST(:job AS uuid) IS NULL OR j.id <> CAST(:job AS uuid))
      AND (CAST(:org AS uuid) IS NULL OR j.organization_id <> CAST(:org AS uuid))
    FOR NO KEY UPDATE SKIP LOCKED
) AS held

-- active_kinds --
-- The kinds of the jobs a claim could take (to pause, for a claim of some kinds only).
SELECT DISTINCT kind FROM jobs WHERE status IN ('queued', 'leased')

-- soonest --
-- Seconds from now to the soonest moment a job waits for (a later start, a retry's backoff,
-- a timer, a signal's timeout); NULL when none waits for one.
SELECT extract(epoch FROM min(m.at) - now())::double precision FROM (
    SELECT j.run_after AS at FROM jobs j
    WHERE j.status = 'queued' AND j.run_after > now()
      AND (CAST(:org AS uuid) IS NULL OR j.organization_id = CAST(:org AS uuid))
      AND (CAST(:kinds AS text[]) IS NULL OR j.kind = ANY (CAST(:kinds AS text[])))
    UNION ALL
    SELECT j.wait_until FROM jobs j
    WHERE j.status = 'waiting' AND j.wait_until IS NOT NULL
      AND (CAST(:org AS uuid) IS NULL OR j.organization_id = CAST(:org AS uuid))
      AND (CAST(:kinds AS text[]) IS NULL OR j.kind = ANY (CAST(:kinds AS text[])))
) AS m

-- until_due --
-- Seconds from now to the moment one job waits for (its start, or its timer), and its status.
SELECT status, wait_signal, wait_children,
       extract(epoch FROM CASE WHEN status = 'queued' THEN run_after ELSE wait_until END
                          - now())::double precision AS seconds
FROM jobs WHERE id = :id

-- shift_jobs --
-- Time passes for the active jobs (every one, one organization's, or one job): each moment
-- they wait for comes :seconds sooner (a queued job's start, a waiting job's timer, a lease's
-- end). Only the owner may write these columns. Returns the queued jobs it made due.
WITH moved AS (
    UPDATE jobs j
    SET run_after = CASE WHEN j.status = 'queued'
                         THEN j.run_after - make_interval(secs => CAST(:seconds AS double precision))
                         ELSE j.run_after END,
        wait_until = CASE WHEN j.status = 'waiting'
                          THEN j.wait_until - make_interval(secs => CAST(:seconds AS double precision))
                          ELSE j.wait_until END,
        lease_until = CASE WHEN j.status IN {RUNNING}
                           THEN j.lease_until - make_interval(secs => CAST(:seconds AS double precision))
                           ELSE j.lease_until END
    WHERE j.status IN {ACTIVE}
      AND (CAST(:job AS uuid) IS NULL OR j.id = CAST(:job AS uuid))
      AND (CAST(:org AS uuid) IS NULL OR j.organization_id = CAST(:org AS uuid))
    RETURNING j.id, j.status, j.run_after
)
SELECT id FROM moved
WHERE status = 'queued' AND run_after <= now()
  AND run_after + make_interval(secs => CAST(:seconds AS double precision)) > now()

-- shift_steps --
-- The same for the moments the jobs recorded as steps (JobContext.sleep_until's "sleep#n", a
-- signal wait's "signal:<name>#n:deadline"), which a later run reads again: written back as
-- the context writes them (ISO 8601, UTC).
UPDATE job_steps s
SET result = to_jsonb(to_char(
        (CAST(s.result #>> '{}' AS timestamptz) - make_interval(secs => CAST(:seconds AS double precision)))
            AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'))
FROM jobs j
WHERE j.id = s.job_id AND j.status IN {ACTIVE}
  AND (CAST(:job AS uuid) IS NULL OR j.id = CAST(:job AS uuid))
  AND (CAST(:org AS uuid) IS NULL OR j.organization_id = CAST(:org AS uuid))
  AND (s.name ~ '^sleep#[0-9]+$' OR s.name ~ '^signal:.+#[0-9]+[:]deadline$')
  AND jsonb_typeof(s.result) = 'string'

-- shift_windows --
-- And for the starts a rate limit counts in its window (claim_jobs()): they move back too.
UPDATE rate_limit_windows w
SET starts = ARRAY(SELECT s.at - make_interval(secs => CAST(:seconds AS double precision))
                   FROM unnest(w.starts) AS s (at))
WHERE CAST(:org AS uuid) IS NULL OR w.organization_id = CAST(:org AS uuid)
