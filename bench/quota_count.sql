-- What a single submit costs in the database as its organization's backlog grows, quota on:
-- 5,000 submit_job() calls, each committed (as the web's would be), timed per 500, from 0 to
-- 5,000 active jobs. Before revision 0024 the quota's count read every active job, so the
-- figure grew with the backlog; since then it reads active_job_counts and stays flat.
-- As a superuser, on a scratch database the checkout migrated:
--   createdb quota_count && DATABASE_URL=postgresql://postgres@127.0.0.1/quota_count \
--       .venv/bin/spacejobs db upgrade && psql -d quota_count -f bench/quota_count.sql
-- It writes an organization, a member and its jobs, and deletes them at the end.
SET client_min_messages = warning;
DELETE FROM organizations WHERE name = 'bench-quota-count';
INSERT INTO organizations (id, name)
VALUES ('00000000-0000-0000-0000-0000000000aa', 'bench-quota-count');
INSERT INTO users (id, email)
VALUES ('00000000-0000-0000-0000-0000000000bb', 'quota-count@example.test') ON CONFLICT DO NOTHING;
INSERT INTO memberships (organization_id, user_id, role)
VALUES ('00000000-0000-0000-0000-0000000000aa', '00000000-0000-0000-0000-0000000000bb', 'member');
DO $$
DECLARE
    started timestamptz;
    figures text := '';
BEGIN
    FOR part IN 1..10 LOOP
        started := clock_timestamp();
        FOR i IN 1..500 LOOP
            -- the organization's cap as high as it goes (as the benchmark's), so it is counted
            PERFORM * FROM submit_job('00000000-0000-0000-0000-0000000000aa',
                                      '00000000-0000-0000-0000-0000000000bb', 'bench.noop', '{}',
                                      3, 30, ARRAY['active'], 'member', NULL, NULL, 'bench', NULL,
                                      NULL, 2147483647, NULL, 0);
            COMMIT;
        END LOOP;
        figures := figures || round(extract(epoch FROM clock_timestamp() - started) * 1000 / 500, 3)
                   || ' ';
    END LOOP;
    RAISE WARNING 'ms per submit, each figure a mean over 500, from 0 to 5,000 active jobs: %',
        figures;
END $$;
DELETE FROM organizations WHERE name = 'bench-quota-count';
