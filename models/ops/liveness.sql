-- A worker's liveness, as its own host sees it (spacejobs worker check, the worker's HTTP
-- probe). Read as the worker role; nothing here is tenant data.

-- processes_on --
-- The processes of one host that have not said they stopped (a SIGKILLed one never says so:
-- the caller keeps only the pids alive on its host).
SELECT id, pid, kinds, running, processed,
       extract(epoch FROM now() - last_seen_at)::float8 AS silent_for
FROM worker_processes
WHERE hostname = :host AND stopped_at IS NULL
ORDER BY id

-- oldest_due --
-- How long the longest-due job of the given kinds has been due (NULL: none is), leaving out the
-- kinds an operator paused or limited: their jobs may wait for a reason no worker can help.
-- Read from the claim's heads (see oldest_due() in the schema).
SELECT extract(epoch FROM now() - oldest_due(CAST(:kinds AS text[])))::float8
