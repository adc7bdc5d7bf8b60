-- Revision 0058: a submit's quota count and claim heads by a plain index scan (issue 32).
--
-- Revision 0055 turned sequential scans off for them. Against PostgreSQL 18, in the full test
-- suite, a long-lived session behind a held transaction still read 39 buffers for the quota
-- count and 98 for the claim heads where it had read 2, after another organization's 1,500
-- jobs (alone, the test read the same before and after): a bitmap scan reads every version of a
-- key and, for the heads, sorts them, where an index scan of claim_heads_newest_idx stops at
-- the first, the newest.

ALTER FUNCTION active_jobs(uuid, text) SET enable_bitmapscan = off;
ALTER FUNCTION lower_claim_heads(uuid[], smallint[], timestamptz[], timestamptz[])
    SET enable_bitmapscan = off;
