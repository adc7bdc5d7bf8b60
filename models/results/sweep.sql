-- The orphan sweep (models/results/sweep.py), as the worker role: both questions go through
-- SECURITY DEFINER functions in the schema, because the worker may not read result_ref.

-- database_now --
-- The listing's start by the database's clock (finished_at's clock), not the sweeper's.
SELECT now()

-- files_in_use --
SELECT ref FROM result_files_in_use(CAST(:refs AS text[]), CAST(:job_ids AS uuid[])) AS ref

-- results_without_files --
SELECT job_id, organization_id, kind
FROM results_without_files(CAST(:present AS text[]), CAST(:listed_at AS timestamptz))
ORDER BY job_id
