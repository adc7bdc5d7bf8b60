-- What bench.cost reads (bench/cost.py), over psycopg as the superuser, in the measured
-- system's own database.

-- lsn --
SELECT pg_current_wal_lsn()::text

-- wal_bytes --
SELECT pg_wal_lsn_diff(%(end)s::pg_lsn, %(start)s::pg_lsn)::bigint

-- vacuum --
-- What autovacuum would do after the jobs, at once: every table of the database.
VACUUM

-- checkpoint --
-- Before a system's life, so that each pays the same full-page images: the first change of
-- every page after a checkpoint logs the whole page.
CHECKPOINT

-- flushed_past --
SELECT pg_current_wal_flush_lsn() >= %(lsn)s::pg_lsn

-- rows_written --
-- Rows inserted, updated and deleted in every table of the database, as the statistics last
-- counted them (each backend reports at most once a second, or 10 s after it went idle).
SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint FROM pg_stat_user_tables

-- commits --
SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()

-- force_flush --
-- This session's own counts (its polls) reach the statistics when it next goes idle.
SELECT pg_stat_force_next_flush()

-- tables_bytes --
-- Every table of the database with its indexes and TOAST.
SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint FROM pg_stat_user_tables

-- relation_bytes --
-- Each table (with its TOAST and free-space and visibility maps) and each index on its own: the
-- growth by relation. Summed, they are tables_bytes.
SELECT c.relname, pg_table_size(c.oid)::bigint FROM pg_stat_user_tables s
JOIN pg_class c ON c.oid = s.relid
UNION ALL
SELECT i.indexrelname, pg_total_relation_size(i.indexrelid)::bigint FROM pg_stat_user_indexes i

-- spacejobs_finished --
SELECT count(*) FROM jobs WHERE status = 'completed'

-- walinspect --
CREATE EXTENSION IF NOT EXISTS pg_walinspect

-- wal_by_relation --
-- The WAL records between two LSNs (pg_walinspect, PostgreSQL 15: one row per record, its
-- blocks as text), each counted whole against the relation of its first block: a B-tree
-- split's record goes to the index it splits, a heap insert's to the table. Records without
-- a block (commits, running-xacts snapshots) are counted by resource manager. Relations are
-- named in this database; another database's blocks (autovacuum elsewhere) are told apart.
WITH records AS (
    SELECT resource_manager, record_length, fpi_length,
           substring(block_ref FROM 'rel (\d+)/\d+/\d+')::oid AS tablespace,
           substring(block_ref FROM 'rel \d+/(\d+)/\d+')::oid AS database,
           substring(block_ref FROM 'rel \d+/\d+/(\d+)')::oid AS filenode
    FROM pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn)
)
SELECT CASE
         WHEN filenode IS NULL THEN resource_manager || ' (no relation)'
         WHEN database NOT IN (0, (SELECT oid FROM pg_database WHERE datname = current_database()))
           THEN 'another database'
         ELSE coalesce(pg_filenode_relation(tablespace, filenode)::regclass::text,
                       'a relation since dropped')
       END AS relation,
       sum(record_length)::bigint AS bytes,
       sum(fpi_length)::bigint AS fpi
FROM records
GROUP BY 1
ORDER BY 2 DESC

-- floor_table --
-- The pgbench floor: the smallest durable job a queue could write, one row with a key and a
-- payload (bench.submit_parts' plain INSERT).
CREATE TABLE floor_jobs (id bigserial PRIMARY KEY, payload jsonb,
                         created_at timestamptz DEFAULT now())
