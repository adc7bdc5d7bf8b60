-- The submit's cost inside the database, without the client: submit_job() called in a loop in
-- one DO block (no round trips, one commit for all), with what the web's transaction would scope.

-- prepare --
SELECT set_config('bench.org', :org, true), set_config('bench.user', :user, true),
       set_config('bench.jobs', :jobs, true)

-- in_database --
DO $$
DECLARE
    started timestamptz := clock_timestamp();
    org uuid := current_setting('bench.org')::uuid;
    member uuid := current_setting('bench.user')::uuid;
BEGIN
    FOR i IN 1..current_setting('bench.jobs')::integer LOOP
        -- no quota (bench.quota measures what it costs), priority 0
        PERFORM * FROM submit_job(org, member, 'bench.noop', '{}', 3, 30, ARRAY['active'],
                                  'member', NULL, NULL, 'bench', NULL, NULL, NULL, NULL, 0);
    END LOOP;
    PERFORM set_config('bench.ms', (extract(epoch FROM clock_timestamp() - started) * 1000)::text,
                       true);
END $$

-- elapsed_ms --
SELECT CAST(current_setting('bench.ms') AS double precision)
