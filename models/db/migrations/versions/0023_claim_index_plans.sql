-- The claim through its indexes only, planned once per session (issue 8, measured by
-- bench.throughput --scale and auto_explain). With 1,000,000 finished and 100,000 queued rows
-- a one-job claim took 80-100 ms instead of ~1 ms on an empty table, for three reasons:
--   * `more_due` (are more jobs due than this claim took?) ran as a sequential scan that
--     expected to meet a queued row at once and met a million finished ones first (212 ms);
--   * an organization's share was read by a bitmap scan of all its 100,000 queued rows and an
--     external sort on disk, because the estimate for the share's filters was one row (82 ms);
--   * every call was planned anew (PL/pgSQL's custom plans for a statement with parameters),
--     a few milliseconds each on a large table.
-- Every read of the claim has an index made for it (jobs_fair_claim_idx, jobs_claimable_idx,
-- jobs_lease_expiry_idx, the organizations' primary key), so it needs neither sequential nor
-- bitmap scans, and a plan made of those indexes does not depend on the table's statistics:
-- one generic plan per session serves every call. Measured on the same table: ~1.3 ms a claim.
ALTER FUNCTION claim_jobs(text, integer, text[], text, uuid) SET enable_seqscan = off;
ALTER FUNCTION claim_jobs(text, integer, text[], text, uuid) SET enable_bitmapscan = off;
ALTER FUNCTION claim_jobs(text, integer, text[], text, uuid) SET plan_cache_mode = force_generic_plan;
