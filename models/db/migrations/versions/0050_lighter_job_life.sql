-- Revision 0050: a job's life writes less (issue 32).
--
-- Measured by python -m bench.cost (2,000 no-op jobs, single submits, whole life, WAL by
-- relation): 4,025 bytes of WAL a job before this revision. Four changes, each its own line:
--
-- * jobs keeps a third of each page free for a job's later versions (fillfactor 35): the claim
--   and the finish write their new version beside the old one, in the same page, and PostgreSQL
--   logs only the bytes between the unchanged prefix and suffix (jobs 919 -> 698 bytes a job);
-- * job_events is keyed by (job_id, id), a job's history in order: one index an event instead
--   of a key on id alone beside it (-198 bytes);
-- * org_audit is keyed by (organization_id, at, id), the order the listing and retention walk:
--   no key on id alone, no BRIN on at, which each submit's later moment widened (-138 bytes);
--   retention walks each organization's oldest entries;
-- * add_active_jobs() updates its slot's rows in place instead of INSERT ... ON CONFLICT DO
--   UPDATE, which locked each row first, a WAL record more per submit (-55 bytes).

ALTER TABLE jobs SET (fillfactor = 35);

ALTER TABLE job_events DROP CONSTRAINT job_events_pkey;
DROP INDEX job_events_job_idx;
ALTER TABLE job_events ADD PRIMARY KEY (job_id, id);

ALTER TABLE org_audit DROP CONSTRAINT org_audit_pkey;
DROP INDEX org_audit_org_at_idx;
DROP INDEX org_audit_at_idx;
ALTER TABLE org_audit ADD PRIMARY KEY (organization_id, at, id);

CREATE OR REPLACE FUNCTION add_active_jobs(p_organization_ids uuid[], p_kinds text[], p_deltas integer[])
RETURNS void LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
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
    -- The slot's rows that exist are updated in place; INSERT ... ON CONFLICT DO UPDATE would
    -- first lock each one, a WAL record more per submit and per finish. Only a slot of its own
    -- may be updated in any order: a shared slot's rows are written in the order of their keys.
    WITH updated AS (
        UPDATE active_job_counts c SET active = c.active + d.delta
        FROM unnest(orgs, kinds, deltas) AS d (organization_id, kind, delta)
        WHERE mine IS NOT NULL AND c.organization_id = d.organization_id AND c.kind = d.kind
          AND c.slot = mine
        RETURNING c.organization_id, c.kind
    )
    INSERT INTO active_job_counts AS c (organization_id, kind, slot, active)
    SELECT d.organization_id, d.kind, coalesce(mine, pg_backend_pid() % slots), d.delta
    FROM unnest(orgs, kinds, deltas) WITH ORDINALITY AS d (organization_id, kind, delta, ord)
    WHERE NOT EXISTS (SELECT 1 FROM updated u
                      WHERE u.organization_id = d.organization_id AND u.kind = d.kind)
    ORDER BY d.ord
    ON CONFLICT (organization_id, kind, slot) DO UPDATE SET active = c.active + excluded.active;
END $$;
REVOKE ALL ON FUNCTION add_active_jobs(uuid[], text[], integer[]) FROM PUBLIC;

CREATE OR REPLACE FUNCTION purge_finished_jobs(batch integer)
RETURNS TABLE (jobs_deleted integer, results_dropped integer, events_deleted integer,
               dropped_refs text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    policy retention_policy;
    n CONSTANT integer := least(greatest(batch, 0), 10000);
    refs_of_jobs text[];
    refs_of_results text[];
BEGIN
    SELECT * INTO STRICT policy FROM retention_policy;
    -- Whole jobs first: their events and diagnostics go with them.
    WITH old AS (
        SELECT id FROM jobs
        WHERE finished_at < now() - policy.keep_jobs AND status IN ('completed', 'failed', 'cancelled')
        ORDER BY finished_at LIMIT n
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM jobs j USING old WHERE j.id = old.id RETURNING j.result_ref
    )
    SELECT count(*), array_agg(gone.result_ref) FILTER (WHERE gone.result_ref IS NOT NULL)
    INTO jobs_deleted, refs_of_jobs FROM gone;

    WITH old AS (
        SELECT id, result_ref FROM jobs
        WHERE finished_at < now() - policy.keep_results AND result IS NOT NULL
          AND result_expired_at IS NULL AND status IN ('completed', 'failed', 'cancelled')
        ORDER BY finished_at LIMIT n
        FOR UPDATE SKIP LOCKED
    ), dropped AS (
        UPDATE jobs j SET result = NULL, result_ref = NULL, result_expired_at = now()
        FROM old WHERE j.id = old.id RETURNING old.result_ref
    )
    SELECT count(*), array_agg(dropped.result_ref) FILTER (WHERE dropped.result_ref IS NOT NULL)
    INTO results_dropped, refs_of_results FROM dropped;

    WITH old AS (
        SELECT e.job_id, e.id FROM jobs j JOIN job_events e ON e.job_id = j.id
        WHERE j.finished_at < now() - policy.keep_events
          AND j.status IN ('completed', 'failed', 'cancelled')
        ORDER BY j.finished_at LIMIT n
    )
    DELETE FROM job_events e USING old WHERE e.job_id = old.job_id AND e.id = old.id;
    GET DIAGNOSTICS events_deleted = ROW_COUNT;
    dropped_refs := coalesce(refs_of_jobs, '{}') || coalesce(refs_of_results, '{}');
    RETURN NEXT;
END $$;
REVOKE ALL ON FUNCTION purge_finished_jobs(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION purge_finished_jobs(integer) TO space_worker;

CREATE OR REPLACE FUNCTION purge_org_audit(batch integer) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    -- Each organization's oldest entries by its log's key: an entry belongs to an existing
    -- organization (the foreign key cascades), so no entry is out of reach.
    WITH old AS (
        SELECT a.organization_id, a.at, a.id
        FROM organizations o
        CROSS JOIN LATERAL (
            SELECT e.organization_id, e.at, e.id FROM org_audit e
            WHERE e.organization_id = o.id
              AND e.at < now() - (SELECT p.keep_audit FROM retention_policy p)
            ORDER BY e.at, e.id
            LIMIT least(greatest(batch, 0), 10000)
            FOR UPDATE SKIP LOCKED
        ) AS a
        LIMIT least(greatest(batch, 0), 10000)
    ), gone AS (
        DELETE FROM org_audit a USING old
        WHERE a.organization_id = old.organization_id AND a.at = old.at AND a.id = old.id
        RETURNING 1
    )
    SELECT count(*)::integer FROM gone
$$;
REVOKE ALL ON FUNCTION purge_org_audit(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION purge_org_audit(integer) TO space_worker;
