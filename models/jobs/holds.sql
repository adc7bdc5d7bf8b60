-- queued_held --
-- Why each of these queued jobs has not started (see queued_jobs_held() in the schema): index
-- probes per job, never a scan of the queue. Jobs not queued, or not the caller's to see, have
-- no row.
SELECT job_id, delayed_until, behind, rate_limited_until
FROM queued_jobs_held(CAST(:ids AS uuid[]), CAST(:rate_kinds AS text[]),
                      CAST(:rate_max AS integer[]), CAST(:rate_seconds AS integer[]))
