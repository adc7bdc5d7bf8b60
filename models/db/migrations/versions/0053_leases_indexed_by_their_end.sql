-- Revision 0053: the indexes of held leases are built on lease_until (issue 32).
--
-- jobs_lease_expiry_idx and jobs_org_running_idx were partial on status IN ('leased',
-- 'cancel_requested'), which every statement that finds a job by its id and lease token also
-- says. The planner, which counts only an index's live entries, read them instead of jobs_pkey,
-- and behind a long-open transaction they hold the entry of every lease taken since it began:
-- 25 minutes into a hold at 200 jobs/s, lock_lease() took 95 ms and a fenced finish of 20 jobs
-- read 32,000 buffers. Built on lease_until IS NOT NULL (set while a lease is held, cleared by
-- every statement that ends one), they hold the same rows, and a lookup by key cannot use them.
-- CREATE INDEX reads jobs once each, writes to jobs waiting meanwhile.

DROP INDEX jobs_lease_expiry_idx;
CREATE INDEX jobs_lease_expiry_idx ON jobs (lease_until) WHERE lease_until IS NOT NULL;
DROP INDEX jobs_org_running_idx;
CREATE INDEX jobs_org_running_idx ON jobs (organization_id, lease_until)
    WHERE lease_until IS NOT NULL;
