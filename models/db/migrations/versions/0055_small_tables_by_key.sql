-- Revision 0055: a submit reads its counts and its claim heads by key (issue 32).
--
-- active_job_counts and claim_heads are small tables whose rows change with every submit and
-- finish (the counts, in place) and every second (the heads, a version a move): the planner
-- scanned them whole for a submit's quota count, its count update and its claim heads, and
-- behind a transaction left open a whole scan reads every version that transaction keeps, of
-- every organization; the count update's join read the slot's rows of every organization by a
-- bitmap scan of the key's third column. By their keys, whatever size the planner takes them
-- for: one probe of the key per count changed.

ALTER FUNCTION active_jobs(uuid, text) SET enable_seqscan = off;
ALTER FUNCTION add_active_jobs(uuid[], text[], integer[]) SET enable_seqscan = off;
ALTER FUNCTION add_active_jobs(uuid[], text[], integer[]) SET enable_bitmapscan = off;
ALTER FUNCTION add_active_jobs(uuid[], text[], integer[]) SET enable_hashjoin = off;
ALTER FUNCTION add_active_jobs(uuid[], text[], integer[]) SET enable_mergejoin = off;
ALTER FUNCTION lower_claim_heads(uuid[], smallint[], timestamptz[], timestamptz[])
    SET enable_seqscan = off;
