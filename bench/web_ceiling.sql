-- What bench.web_ceiling --profile reads (bench/web_ceiling.py), as a superuser.

-- web_backends --
-- The web's backends (role space_app) in the benchmark's database at one moment: each one's
-- state, what it waits for ("on CPU" when nothing), and its statement's first line (our
-- statements begin with a comment that names them). Sampled every 10 ms; counted, the
-- samples say whether the web's transactions wait for a lock, for the disk, or for the web.
SELECT state,
       coalesce(wait_event_type || ': ' || wait_event, 'on CPU') AS waiting_for,
       split_part(ltrim(query), E'\n', 1) AS first_line
FROM pg_stat_activity
WHERE usename = 'space_app' AND datname = current_database()

-- sessions_opened --
-- How many sessions this database has seen opened (each backend counts its own at connect
-- time and reports it with its other statistics): read before and after a URL's run, the
-- difference says whether the web kept its connections or opened new ones as it went.
SELECT sessions FROM pg_stat_database WHERE datname = current_database()
