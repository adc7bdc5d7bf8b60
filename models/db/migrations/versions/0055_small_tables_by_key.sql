-- Revision 0055: a submit reads its counts and its claim heads by key (issue 32).
--
-- active_job_counts and claim_heads are small tables whose rows change with every submit and
-- finish (the counts, in place) and every second (the heads, a version a move). A long-lived
-- session's plans scanned them whole (in a hold's database, 1,639 and 497 sequential scans in
-- 50 s), and the count update joined the slot's rows of every organization, found by a bitmap
-- scan of the key's third column; behind a transaction left open, each read every version that
-- transaction keeps, of every organization. By their keys, whatever size the planner takes
-- them for: one probe of the key per count changed, and for the heads an index scan, which
-- stops at a key's first entry in claim_heads_newest_idx, its newest (a bitmap scan reads every
-- version of the key and sorts them).

ALTER FUNCTION active_jobs(uuid, text) SET enable_seqscan = off;
ALTER FUNCTION add_active_jobs(uuid[], text[], integer[]) SET enable_seqscan = off;
ALTER FUNCTION add_active_jobs(uuid[], text[], integer[]) SET enable_bitmapscan = off;
ALTER FUNCTION add_active_jobs(uuid[], text[], integer[]) SET enable_hashjoin = off;
ALTER FUNCTION add_active_jobs(uuid[], text[], integer[]) SET enable_mergejoin = off;
ALTER FUNCTION lower_claim_heads(uuid[], smallint[], timestamptz[], timestamptz[])
    SET enable_seqscan = off;
ALTER FUNCTION lower_claim_heads(uuid[], smallint[], timestamptz[], timestamptz[])
    SET enable_bitmapscan = off;
