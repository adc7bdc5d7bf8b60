-- Each peer gets a database of its own on the benchmark's server; {database} is an identifier
-- composed with psycopg.sql, never a parameter.

-- create_database --
CREATE DATABASE {database}

-- drop_database --
-- FORCE: a worker killed a moment ago may still hold a backend.
DROP DATABASE IF EXISTS {database} WITH (FORCE)
