-- Revision 0057: the index of a rate-limited kind's queued jobs serves only statements that
-- name a kind (issue 32).
--
-- With jobs_claimable_idx gone (revision 0056), the workers' generic plan of claim_jobs() read
-- jobs_kind_claim_idx in place of jobs_fair_claim_idx: its first column, the kind, unbounded,
-- the whole index, through the entry of every job queued since a long-open transaction began
-- (sampled in a 30-minute hold at 200 jobs/s: 7 scans a claim; the claim's p95 grew from 3 ms
-- before the hold to 20 ms in the hold's 16th minute). The planner counts only a partial index's
-- live entries, which makes any index of queued jobs look small. `kind IS NOT NULL` (always
-- true: the column is NOT NULL) is implied by the rate-limited claim's `kind = ...`, and by
-- nothing the fair claim says. CREATE INDEX reads jobs once, writes to jobs waiting meanwhile.

DROP INDEX jobs_kind_claim_idx;
CREATE INDEX jobs_kind_claim_idx ON jobs (kind, organization_id, priority DESC, run_after,
                                          created_at)
    WHERE status = 'queued' AND kind IS NOT NULL;
