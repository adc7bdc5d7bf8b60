-- The statement trigger of job updates joins new_jobs to old_jobs by hash (issue 8, measured).
-- PL/pgSQL plans each of its statements once per session and keeps the plan. A transition table
-- has no statistics, so the planner took it for one row and chose a nested loop, which compares
-- every new row with every old one: for a batch of 64 jobs, 4,096 comparisons in each of the
-- three statements (auto_explain: "Rows Removed by Join Filter: 4032", 4.7 ms for the
-- job_events insert alone). None of the three statements reads an index, so they lose nothing
-- without nested loops; every other statement keeps the server's setting. JIT goes off with it:
-- the metrics statement's LATERAL can only be a nested loop, whose cost, once disabled, passes
-- jit_above_cost, and LLVM compiled the statement on every call (~300 ms, auto_explain).
ALTER FUNCTION jobs_after_update() SET enable_nestloop = off;
ALTER FUNCTION jobs_after_update() SET jit = off;
