-- The default cap on each organization's active jobs (quota_policy in the schema): one row,
-- written by the owner only.

-- read --
SELECT active_jobs FROM quota_policy

-- update --
UPDATE quota_policy SET active_jobs = :active_jobs, updated_at = now()
