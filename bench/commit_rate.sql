-- One commit with one single-row write: what one PostgreSQL primary carries in commits/s
-- (docs/scaling.md). pgbench runs it on a scratch table of 1,000 rows:
--   createdb commit_rate && psql -d commit_rate -c "CREATE TABLE counters AS
--       SELECT g AS id, 0 AS n FROM generate_series(1, 1000) g; ALTER TABLE counters ADD PRIMARY KEY (id)"
--   pgbench -n -c 8 -j 2 -T 15 -f bench/commit_rate.sql commit_rate
\set id random(1, 1000)
UPDATE counters SET n = n + 1 WHERE id = :id;
