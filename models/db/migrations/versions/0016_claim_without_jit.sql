-- The claim without JIT (issue 8, measured). The planner's estimate for claim_jobs's statement
-- grows with the queue (it cannot know that each organization's LATERAL takes only its share),
-- and past jit_above_cost (100,000 by default) PostgreSQL compiled the statement with LLVM on
-- every call: ~100 ms of compilation for a statement that runs in ~6 ms, with 120,000 jobs
-- queued (auto_explain: "JIT: Functions: 87 ... Total 98.7 ms"); batches of 100 took 120 ms
-- instead of 21. The claim is short OLTP work that JIT never pays off for, so it is off for this
-- function alone; reports and dashboards keep the server's setting.
ALTER FUNCTION claim_jobs(text, integer, text[], text, uuid) SET jit = off;
