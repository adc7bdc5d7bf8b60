-- What one run of the claim heads' chore costs as organizations grow (revision 0051): the run
-- holds the lock every submit of a claimable job waits for, so its time is the longest a submit
-- waits for it. 5,000 organizations, each with a queued job and its head set back to the start
-- before every run (so that every key moves), timed in the same run: advance_claim_heads() over
-- every organization at once (as before revision 0051, and as the previous release's beat still
-- calls it) and over a slice of 500 (the chore's run), median of 5 runs each, each committed.
-- On a database before revision 0051 only the first is timed (the function of revision 0048).
-- As a superuser, on a scratch database the checkout migrated:
--   createdb claim_heads && DATABASE_URL=postgresql://postgres@127.0.0.1/claim_heads \
--       .venv/bin/spacejobs db upgrade && psql -d claim_heads -f bench/claim_heads.sql
-- It writes organizations, a member and their jobs, and deletes them at the end.
SET client_min_messages = warning;
DELETE FROM organizations WHERE name LIKE 'bench-claim-heads-%';
INSERT INTO users (id, email)
VALUES ('00000000-0000-0000-0000-0000000000cc', 'claim-heads@example.test') ON CONFLICT DO NOTHING;
INSERT INTO organizations (name)
SELECT 'bench-claim-heads-' || n FROM generate_series(1, 5000) AS n;
INSERT INTO memberships (organization_id, user_id, role)
SELECT id, '00000000-0000-0000-0000-0000000000cc', 'member' FROM organizations
WHERE name LIKE 'bench-claim-heads-%';
INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds, max_attempts, run_after,
                  created_at)
SELECT id, '00000000-0000-0000-0000-0000000000cc', 'bench.noop', 30, 3,
       now() - interval '1 minute', now() - interval '1 minute'
FROM organizations WHERE name LIKE 'bench-claim-heads-%';
VACUUM ANALYZE claim_heads;
DO $$
DECLARE
    started timestamptz;
    every_org double precision[] := '{}';
    a_slice double precision[] := '{}';
    moved integer;
    expected integer;
BEGIN
    FOR run IN 1..5 LOOP
        FOR way IN 1..2 LOOP
            -- every head back at the start: each has its job to pass
            INSERT INTO claim_heads (organization_id, priority, run_after, created_at)
            SELECT id, 0, '-infinity', '-infinity' FROM organizations
            WHERE name LIKE 'bench-claim-heads-%';
            COMMIT;
            started := clock_timestamp();
            IF way = 1 THEN
                moved := advance_claim_heads(interval '0', interval '300 seconds');
                expected := 5000;
                every_org := every_org
                    || extract(epoch FROM clock_timestamp() - started)::float8 * 1000;
            ELSIF to_regprocedure('advance_claim_heads(interval, interval, uuid, integer)')
                  IS NOT NULL THEN
                -- (dynamic: before revision 0051 the function does not exist)
                EXECUTE 'SELECT a.moved FROM advance_claim_heads(interval ''0'','
                        ' interval ''300 seconds'', NULL, 500) AS a' INTO moved;
                expected := 500;
                a_slice := a_slice
                    || extract(epoch FROM clock_timestamp() - started)::float8 * 1000;
            ELSE
                CONTINUE;
            END IF;
            COMMIT;
            IF moved < expected THEN
                RAISE EXCEPTION 'a run moved % heads of %', moved, expected;
            END IF;
        END LOOP;
    END LOOP;
    RAISE WARNING 'one run, 5,000 organizations: every organization % ms, a slice of 500 % ms '
                  '(median of 5; all: % / %)',
        round((SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY x) FROM unnest(every_org) x)::numeric, 1),
        round((SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY x) FROM unnest(a_slice) x)::numeric, 1),
        (SELECT string_agg(round(x::numeric, 1)::text, ' ') FROM unnest(every_org) x),
        (SELECT string_agg(round(x::numeric, 1)::text, ' ') FROM unnest(a_slice) x);
END $$;
DELETE FROM claim_heads h USING organizations o
WHERE h.organization_id = o.id AND o.name LIKE 'bench-claim-heads-%';
DELETE FROM organizations WHERE name LIKE 'bench-claim-heads-%';
