-- Revision 0058: a submit plans no statement again at every call (issue 32).
--
-- Measured with pg_stat_statements (track = all, track_planning = on) over bench.submit_cost's
-- submits: the active counts' update in add_active_jobs() and the heads' insert in
-- lower_claim_heads() were planned once per call (8,241 plans for 8,240 calls; planning 0.13
-- and 0.09 ms a call against 0.04 and 0.01 of execution): a plan made for the call's arrays
-- always looked cheaper than the generic one, so PL/pgSQL never kept one. workflow_step_kinds(),
-- a SQL function whose body holds a subquery, is never inlined and was planned at every call.
-- The first two keep one generic plan a session; the count update becomes one update per key
-- by the whole key, since the generic plan of its join of the arrays to the table read the
-- key's index by its third column (the slot), every organization's entries (auto_explain,
-- tests/integration/test_nested_statements.py). The third becomes PL/pgSQL, which keeps its
-- plan and returns at once for a job that is not a workflow. CREATE OR REPLACE keeps the
-- grants.

-- Adds the jobs that became active (+1) or stopped being active (-1), one entry per job, to
-- active_job_counts, summed per (organization, kind). The rows written are the calling
-- transaction's slot's: the first of 64 advisory locks it can take (or already holds), held
-- until it ends, so no other transaction writes those rows meanwhile and nobody waits on them.
-- Only with all 64 held by other writers does it share slot pid % 64, whose row locks then
-- order the writers. Called by the jobs triggers only (as the owner). Each key's row is
-- written by its whole key, one probe of the table's key, in one generic plan a session: a
-- scan of the slot's rows (by the key's third column, or the whole table) reads every version
-- of every organization's counts that a long-open transaction keeps, and a plan made for each
-- call's values, cheaper on paper every time, would be made again at every submit and finish.
CREATE OR REPLACE FUNCTION add_active_jobs(p_organization_ids uuid[], p_kinds text[], p_deltas integer[])
RETURNS void LANGUAGE plpgsql SET search_path = public, pg_temp
SET enable_seqscan = off SET enable_bitmapscan = off SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    slots CONSTANT integer := 64;
    lock_key CONSTANT integer := hashtext('spacejobs.active_job_counts');
    orgs uuid[];
    kinds text[];
    deltas bigint[];
    mine integer;
BEGIN
    -- A claim or a heartbeat moves jobs between active statuses: nothing to add, no slot taken.
    SELECT array_agg(d.organization_id ORDER BY d.organization_id, d.kind),
           array_agg(d.kind ORDER BY d.organization_id, d.kind),
           array_agg(d.delta ORDER BY d.organization_id, d.kind)
    INTO orgs, kinds, deltas
    FROM (SELECT u.organization_id, u.kind, sum(u.delta) AS delta
          FROM unnest(p_organization_ids, p_kinds, p_deltas) AS u (organization_id, kind, delta)
          GROUP BY u.organization_id, u.kind
          HAVING sum(u.delta) <> 0) AS d;
    IF orgs IS NULL THEN
        RETURN;
    END IF;
    FOR i IN 0 .. slots - 1 LOOP
        IF pg_try_advisory_xact_lock(lock_key, i) THEN
            mine := i;
            EXIT;
        END IF;
    END LOOP;
    IF mine IS NULL THEN
        -- All 64 held by other writers: slot pid % 64, shared, its rows written in the order
        -- of their keys.
        INSERT INTO active_job_counts AS c (organization_id, kind, slot, active)
        SELECT d.organization_id, d.kind, pg_backend_pid() % slots, d.delta
        FROM unnest(orgs, kinds, deltas) WITH ORDINALITY AS d (organization_id, kind, delta, ord)
        ORDER BY d.ord
        ON CONFLICT (organization_id, kind, slot) DO UPDATE SET active = c.active + excluded.active;
        RETURN;
    END IF;
    -- The slot's row of each key updated in place: INSERT ... ON CONFLICT DO UPDATE would
    -- first lock the row, a WAL record more per submit and finish.
    FOR i IN 1 .. cardinality(orgs) LOOP
        UPDATE active_job_counts c SET active = c.active + deltas[i]
        WHERE c.organization_id = orgs[i] AND c.kind = kinds[i] AND c.slot = mine;
        IF NOT FOUND THEN
            INSERT INTO active_job_counts AS c (organization_id, kind, slot, active)
            VALUES (orgs[i], kinds[i], mine, deltas[i])
            ON CONFLICT (organization_id, kind, slot)
                DO UPDATE SET active = c.active + excluded.active;
        END IF;
    END LOOP;
END $$;

-- Jobs that just became claimable (submitted, put back in the queue, moved in it), one array
-- element each: their keys' heads move back to their positions where they were further on, and
-- a key with no head gets one. Called by the jobs triggers, before the jobs' transaction
-- commits.
--
-- Why a head is never ahead of a claimable job. The lock taken here (shared: the triggers do
-- not wait for each other) is the one advance_claim_heads() takes exclusively, and only tries
-- to: while this transaction is open, no head moves forward; and a head moved forward before
-- this lock was granted is read below in a snapshot taken after it, so a position further on
-- than the job's is seen, and lowered. After this commit the job is visible to the next
-- advance, which stops at it. A transaction that reads one snapshot for all its statements
-- (REPEATABLE READ, SERIALIZABLE) may not see the newest head: its keys' heads go back to the
-- start, and the next advance moves them on.
CREATE OR REPLACE FUNCTION lower_claim_heads(p_orgs uuid[], p_priorities smallint[],
                                  p_run_after timestamptz[], p_created_at timestamptz[])
RETURNS void
LANGUAGE plpgsql SET search_path = public, pg_temp
-- One index probe a key, whatever the calling trigger turned off, and however small the table
-- looks: a sequential scan, or a bitmap scan sorted afterwards, reads every head version a
-- long-open transaction keeps; the index's first entry of a key is its newest. One generic
-- plan a session (as add_active_jobs()): planned for each call's arrays, the insert was
-- planned again at every submit.
SET enable_nestloop = on SET enable_seqscan = off SET enable_bitmapscan = off
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    fresh_snapshot CONSTANT boolean := current_setting('transaction_isolation') = 'read committed';
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext('spacejobs.claim_heads'));
    INSERT INTO claim_heads (organization_id, priority, run_after, created_at)
    SELECT c.org, c.priority,
           CASE WHEN fresh_snapshot THEN c.run_after ELSE '-infinity' END,
           CASE WHEN fresh_snapshot THEN c.created_at ELSE '-infinity' END
    FROM (SELECT DISTINCT ON (j.org, j.priority) j.org, j.priority, j.run_after, j.created_at
          FROM unnest(p_orgs, p_priorities, p_run_after, p_created_at)
              AS j (org, priority, run_after, created_at)
          ORDER BY j.org, j.priority, j.run_after, j.created_at) AS c
    LEFT JOIN LATERAL (
        SELECT h.run_after, h.created_at FROM claim_heads h
        WHERE h.organization_id = c.org AND h.priority = c.priority
        ORDER BY h.priority DESC, h.version DESC
        LIMIT 1
    ) AS h ON true
    WHERE h.run_after IS NULL OR NOT fresh_snapshot
       OR (c.run_after, c.created_at) < (h.run_after, h.created_at);
END $$;

-- The kinds of the steps a submitted workflow (a job of the kind 'workflow', whose params hold
-- its steps: models/jobs/workflows.py) will make, one entry per step; empty for any other job.
-- Read from the params the database stores, never from the caller: what is admitted and
-- reserved is exactly what the workflow's run will make. PL/pgSQL, not SQL: a SQL function
-- whose body holds a subquery is not inlined, and was planned again at every call (every
-- submit), where PL/pgSQL keeps its plan for the session and a plain job never reaches it.
CREATE OR REPLACE FUNCTION workflow_step_kinds(p_kind text, p_params jsonb) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_kind = 'workflow' AND jsonb_typeof(p_params -> 'steps') = 'array' THEN
        RETURN ARRAY(SELECT s.step ->> 'kind'
                     FROM jsonb_array_elements(p_params -> 'steps') AS s (step));
    END IF;
    RETURN '{}'::text[];
END $$;
