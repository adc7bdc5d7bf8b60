-- Worker presence: one row per process that runs jobs, heartbeated by itself. Nothing here is
-- tenant data.

-- register --
INSERT INTO worker_processes (id, node, hostname, pid, version, queues, kinds, concurrency)
VALUES (:id, :node, :host, :pid, :version, :queues, :kinds, :concurrency)
ON CONFLICT (id) DO UPDATE SET
    node = excluded.node, version = excluded.version, queues = excluded.queues,
    kinds = excluded.kinds, concurrency = excluded.concurrency,
    running = 0, processed = 0, failed = 0,
    started_at = now(), last_seen_at = now(), stopped_at = NULL

-- heartbeat --
UPDATE worker_processes
SET last_seen_at = now(), running = :running, processed = :processed, failed = :failed
WHERE id = :id

-- stopped --
UPDATE worker_processes SET stopped_at = now(), running = 0 WHERE id = :id
