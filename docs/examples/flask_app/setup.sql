-- What the application's database needs, run once by whoever administers it (after `spacejobs
-- db upgrade` made Space Jobs' own roles and schema). The application's role, thumbs_app here,
-- is its own: it owns its tables, in a schema of its own, never in public.
CREATE ROLE thumbs_app LOGIN;                          -- and a password, in production
GRANT space_app TO thumbs_app;                         -- submit, read, cancel, signal jobs
GRANT space_tenancy TO thumbs_app;                     -- write its teams and people as tenants
CREATE SCHEMA thumbs AUTHORIZATION thumbs_app;         -- its tables (db.create_all() as thumbs_app)

-- after-tables --
-- Once the application made its tables: what Space Jobs' workers may do with them. The worker
-- role reads and writes the rows of the organization whose job it holds (lease_org()), while
-- that job's lease holds, and nothing else.
GRANT USAGE ON SCHEMA thumbs TO space_worker;
GRANT SELECT, UPDATE ON thumbs.photos TO space_worker;
ALTER TABLE thumbs.photos ENABLE ROW LEVEL SECURITY;
CREATE POLICY space_worker_lease ON thumbs.photos TO space_worker
    USING (organization_id = (SELECT lease_org()))
    WITH CHECK (organization_id = (SELECT lease_org()));
