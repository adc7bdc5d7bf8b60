-- bench.storage_sketch: a job's life written by hand in three storage shapes, for the WAL each
-- costs (issue 32). Not the engine: no trigger, no function of the schema; each statement
-- writes what the engine's statements and triggers write for the same step, into copies of
-- the real tables (LIKE, so the rows are as wide as the real ones). %(shape)s prefixes the
-- copies: 'wide' (today: the job's row carries its state, with every index of jobs), 'narrow'
-- (the row with two indexes; the queued and the leased state in rows of their own, deleted as
-- the job moves on) or 'rotated' (the same rows, never deleted one by one: truncated).

-- tables_wide --
CREATE TABLE wide_jobs (LIKE jobs INCLUDING ALL) WITH (fillfactor = 35);

-- tables_narrow --
-- The job's record: its key and the tenant's listing, nothing its state changes, so a claim's
-- and a finish's updates can be HOT (the same page, no index entry).
CREATE TABLE %(shape)s_jobs (LIKE jobs INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    WITH (fillfactor = 35);
ALTER TABLE %(shape)s_jobs ADD PRIMARY KEY (id);
CREATE INDEX ON %(shape)s_jobs (organization_id, created_at DESC, id DESC);
-- The queued jobs, what the claim orders by: today's fair and rate-limited claim indexes.
CREATE TABLE %(shape)s_queue (id uuid NOT NULL, organization_id uuid NOT NULL,
                              kind text NOT NULL, priority integer NOT NULL,
                              run_after timestamptz NOT NULL, created_at timestamptz NOT NULL);
CREATE INDEX ON %(shape)s_queue (organization_id, priority DESC, run_after, created_at);
CREATE INDEX ON %(shape)s_queue (kind, organization_id, priority DESC, run_after, created_at);
-- The leases taken: by expiry (the sweeper), by organization (the claim's running count).
CREATE TABLE %(shape)s_leases (id uuid NOT NULL, organization_id uuid NOT NULL,
                               lease_until timestamptz NOT NULL);
CREATE INDEX ON %(shape)s_leases (lease_until);
CREATE INDEX ON %(shape)s_leases (organization_id, lease_until);

-- tables_narrow_deleted --
-- Rows deleted as the job moves on: the finish finds its lease by the job.
ALTER TABLE narrow_leases ADD PRIMARY KEY (id);

-- tables_narrow_rotated --
-- Rows never deleted one by one (the segments are truncated once every job in them moved on):
-- the claim reads the queue from where the organization's last claim stopped.
CREATE TABLE rotated_cursor (organization_id uuid PRIMARY KEY, created_at timestamptz NOT NULL,
                             id uuid NOT NULL);
INSERT INTO rotated_cursor SELECT id, '-infinity', '00000000-0000-0000-0000-000000000000'
FROM organizations;

-- tables_common --
-- What both shapes write alike: the events, the audit entry, the quota count, the metrics.
CREATE TABLE %(shape)s_events (LIKE job_events INCLUDING ALL);
CREATE TABLE %(shape)s_audit (LIKE org_audit INCLUDING ALL);
CREATE TABLE %(shape)s_counts (LIKE active_job_counts INCLUDING ALL);
CREATE TABLE %(shape)s_metrics (LIKE metric_events INCLUDING ALL);

-- job_ids --
-- The real jobs submitted for the run, whose rows each variant copies.
SELECT id FROM jobs ORDER BY created_at

-- count_row --
INSERT INTO %(shape)s_counts (organization_id, kind, slot, active)
VALUES (%(org)s, %(kind)s, 0, 0)

-- standing --
-- The submit's and the finish's check of the requester's standing, held until commit.
SELECT m.role FROM memberships m JOIN organizations o ON o.id = m.organization_id
WHERE m.organization_id = %(org)s AND m.user_id = %(user)s
FOR SHARE OF m, o

-- requester_key --
-- The foreign key's check of jobs.requested_by (the copies have no foreign key).
SELECT 1 FROM users WHERE id = %(user)s FOR KEY SHARE

-- submit_job --
INSERT INTO %(shape)s_jobs SELECT * FROM jobs WHERE id = %(id)s

-- submit_queue --
INSERT INTO %(shape)s_queue (id, organization_id, kind, priority, run_after, created_at)
SELECT id, organization_id, kind, priority, run_after, created_at FROM jobs WHERE id = %(id)s

-- submit_event --
INSERT INTO %(shape)s_events (job_id, organization_id, from_status, to_status, attempt, actor)
SELECT id, organization_id, NULL, 'queued', 0, 'user:' || requested_by FROM jobs WHERE id = %(id)s

-- submit_audit --
INSERT INTO %(shape)s_audit (organization_id, actor_id, actor, action, job_id, detail)
SELECT organization_id, requested_by, 'user:' || requested_by, 'job.submit', id,
       jsonb_build_object('kind', kind)
FROM jobs WHERE id = %(id)s

-- count_change --
UPDATE %(shape)s_counts SET active = active + %(delta)s WHERE organization_id = %(org)s

-- claim_wide --
-- Each claim picks the jobs it leases (here, its shape's part), then lease_rows changes their rows.
SELECT id FROM wide_jobs
WHERE organization_id = %(org)s AND status = 'queued'
ORDER BY priority DESC, run_after, created_at LIMIT %(batch)s FOR UPDATE SKIP LOCKED

-- claim_narrow --
WITH picked AS (
    SELECT ctid FROM narrow_queue
    WHERE organization_id = %(org)s
    ORDER BY priority DESC, run_after, created_at LIMIT %(batch)s FOR UPDATE SKIP LOCKED
), taken AS (
    DELETE FROM narrow_queue q USING picked WHERE q.ctid = picked.ctid
    RETURNING q.id, q.organization_id
)
INSERT INTO narrow_leases (id, organization_id, lease_until)
SELECT id, organization_id, now() + interval '30 s' FROM taken
RETURNING id

-- claim_rotated --
WITH picked AS (
    SELECT q.id, q.organization_id, q.created_at FROM rotated_queue q
    WHERE q.organization_id = %(org)s
      AND (q.created_at, q.id) > (SELECT c.created_at, c.id FROM rotated_cursor c
                                  WHERE c.organization_id = %(org)s)
    ORDER BY q.created_at, q.id LIMIT %(batch)s
), moved AS (
    UPDATE rotated_cursor c SET created_at = last.created_at, id = last.id
    FROM (SELECT p.created_at, p.id FROM picked p ORDER BY p.created_at DESC, p.id DESC LIMIT 1)
         AS last
    WHERE c.organization_id = %(org)s
)
INSERT INTO rotated_leases (id, organization_id, lease_until)
SELECT id, organization_id, now() + interval '30 s' FROM picked
RETURNING id

-- lease_rows --
UPDATE %(shape)s_jobs j
SET status = 'leased', attempts = j.attempts + 1, started_at = clock_timestamp(),
    leased_by = 'sketch', lease_token = gen_random_uuid(), lease_until = now() + interval '30 s',
    updated_at = now()
WHERE j.id = ANY(%(ids)s::uuid[])

-- end_leases_narrow --
-- Only where the leases are deleted one by one.
DELETE FROM narrow_leases l WHERE l.id = ANY(%(ids)s::uuid[])

-- finish_rows --
UPDATE %(shape)s_jobs j
SET status = 'completed', result = 'null', finished_at = clock_timestamp(), lease_token = NULL,
    lease_until = NULL, leased_by = NULL, updated_at = now()
WHERE j.id = ANY(%(ids)s::uuid[])

-- rotate --
-- Every job in the segments moved on: the rotation's whole cost.
TRUNCATE rotated_queue, rotated_leases

-- batch_events --
INSERT INTO %(shape)s_events (job_id, organization_id, from_status, to_status, attempt, actor)
SELECT id, %(org)s, %(from)s, %(to)s, 1, 'space_worker' FROM unnest(%(ids)s::uuid[]) AS t (id)

-- batch_metrics --
-- What the update trigger writes per batch: a few rows per kind and bucket.
INSERT INTO %(shape)s_metrics (name, kind, label, value)
SELECT m, %(kind)s, '0.005', %(n)s FROM unnest(%(names)s::text[]) AS t (m)

-- vacuum --
VACUUM

-- sizes --
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
WHERE c.relkind = 'r' AND c.relname LIKE %(prefix)s

-- flush_counts --
-- A backend sends its table counts at a transaction's end at most once a second: forced, and
-- sent at the end of the next statement (after_flush).
SELECT pg_stat_force_next_flush()

-- after_flush --
SELECT 1

-- rows_written --
SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint,
       coalesce(sum(n_tup_hot_upd), 0)::bigint
FROM pg_stat_user_tables WHERE relname LIKE %(prefix)s
