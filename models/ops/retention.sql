-- The retention policy (retention_policy in the schema): one row, written by the owner only.

-- read --
SELECT extract(epoch FROM keep_jobs) AS jobs_seconds,
       extract(epoch FROM keep_results) AS results_seconds,
       extract(epoch FROM keep_events) AS events_seconds,
       extract(epoch FROM keep_audit) AS audit_seconds,
       updated_at
FROM retention_policy

-- update --
-- A NULL keeps that age as it is.
UPDATE retention_policy
SET keep_jobs = coalesce(CAST(:jobs_seconds AS double precision) * interval '1 second', keep_jobs),
    keep_results = coalesce(CAST(:results_seconds AS double precision) * interval '1 second',
                            keep_results),
    keep_events = coalesce(CAST(:events_seconds AS double precision) * interval '1 second',
                           keep_events),
    keep_audit = coalesce(CAST(:audit_seconds AS double precision) * interval '1 second',
                          keep_audit),
    updated_at = now()
