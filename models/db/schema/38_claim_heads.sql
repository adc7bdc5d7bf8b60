-- The claim's heads: where each (organization, priority) key's queued jobs begin, so that a
-- claim reads no history (60_claim_and_lease.sql reads them and moves them forward).

-- Where each organization's queued jobs begin, so that a claim starts there instead of walking
-- the index from its beginning. jobs_fair_claim_idx keeps an entry for every job that was ever
-- queued until vacuum removes it, and vacuum removes none that a transaction still open may
-- see: behind a REPEATABLE READ report left open for ten minutes, every job finished in those
-- ten minutes lies at the start of its organization's range, and a claim that reads from the
-- start fetches each of them from the heap to learn it is gone (issue 32: 162,240 buffers a
-- claim instead of 2,507).
--
-- One head per (organization, priority) key that had claimable jobs: a position in the claim's
-- order within the key, (run_after, created_at), below which no queued job of the key remains.
-- The claim scans each key from its head. A head may lag behind the first queued job (the
-- claim then reads a few entries more); it is never ahead of one (the claim would not see
-- it): the jobs triggers move a head back before the job they make claimable commits
-- (lower_claim_heads()), and only advance_claim_heads() moves heads forward.
--
-- A key's head is its row of the highest version. A move writes a new version, never an
-- UPDATE: under an open transaction an updated row keeps every old version in its chain, and
-- the claim, which reads the heads, would walk them all. The versions a newer one superseded
-- are deleted by advance_claim_heads(); the newest is the first entry of the key in
-- claim_heads_newest_idx, whatever dead versions follow it. No foreign key to organizations:
-- a head outlives nothing it matters for (the claim joins organizations, and a key with no
-- queued job is dropped after a while), and a check per submit would cost an index probe.
CREATE SEQUENCE claim_head_versions;
CREATE TABLE claim_heads (
    organization_id uuid NOT NULL,
    priority        smallint NOT NULL,
    version         bigint NOT NULL DEFAULT nextval('claim_head_versions'),
    run_after       timestamptz NOT NULL,
    created_at      timestamptz NOT NULL,
    -- The last time the key was seen with work: a key idle for long is dropped.
    busy_at         timestamptz NOT NULL DEFAULT now()
);
ALTER SEQUENCE claim_head_versions OWNED BY claim_heads.version;
CREATE INDEX claim_heads_newest_idx ON claim_heads (organization_id, priority DESC, version DESC);

-- claim_heads: the owner's alone (the claim, the jobs triggers and advance_claim_heads() read
-- and write it as the owner).
ALTER TABLE claim_heads ENABLE ROW LEVEL SECURITY;
ALTER TABLE claim_heads FORCE ROW LEVEL SECURITY;
CREATE POLICY owner_admin ON claim_heads TO space_owner USING (true) WITH CHECK (true);

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
CREATE FUNCTION lower_claim_heads(p_orgs uuid[], p_priorities smallint[],
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
REVOKE ALL ON FUNCTION lower_claim_heads(uuid[], smallint[], timestamptz[], timestamptz[])
    FROM PUBLIC;
