-- The submit's cost inside the database, without the client: submit_jobs() of one job (what a
-- single submit runs) called in a loop in one DO block (no round trips, one commit for all),
-- with what the web's transaction would scope.

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
        -- no kind's quota (bench.quota measures what it costs), priority 0
        PERFORM * FROM submit_jobs(
            p_organization_id => org, p_requested_by => member, p_org_states => ARRAY['active'],
            p_role => 'member', p_request_id => 'bench', p_ids => ARRAY[gen_random_uuid()],
            p_kinds => ARRAY['bench.noop'], p_params => ARRAY['{}'::jsonb],
            p_max_attempts => ARRAY[3], p_lease_seconds => ARRAY[30],
            p_dedup_keys => ARRAY[NULL::text], p_run_afters => ARRAY[NULL::timestamptz],
            p_org_quota => NULL, p_kind_quotas => ARRAY[NULL::integer], p_priorities => ARRAY[0],
            p_bulk => false);
    END LOOP;
    PERFORM set_config('bench.ms', (extract(epoch FROM clock_timestamp() - started) * 1000)::text,
                       true);
END $$

-- elapsed_ms --
SELECT CAST(current_setting('bench.ms') AS double precision)
