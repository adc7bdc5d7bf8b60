-- count_event() is the web's and the workers' one door to three counters, and it took any
-- amount and any kind: as space_app, count_event('spacejobs_wakeups_published_total', '', -1e9)
-- made a Prometheus counter go down (read as a reset by every rate()), 'NaN' or 'Infinity'
-- poisoned it for good, and free-text kinds grew its label set without bound. Now it counts
-- only a positive, finite amount (a flush's sum: at most a billion) under a kind's name.
CREATE OR REPLACE FUNCTION count_event(p_name text, p_kind text, p_by double precision)
RETURNS void LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT bump_metric(p_name, p_kind, '', p_by)
    WHERE p_name IN ('spacejobs_stale_finishes_fenced_total', 'spacejobs_wakeups_published_total',
                     'spacejobs_wakeups_failed_total')
      AND p_by > 0 AND p_by <= 1e9
      AND (p_kind = '' OR p_kind ~ '^[a-z][a-z0-9_.]{0,63}$')
$$;
