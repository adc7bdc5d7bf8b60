"""Worker presence: each worker process registers and heartbeats its own row."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, text


def register(
    conn: Connection,
    *,
    process_id: str,
    node: str,
    hostname: str,
    pid: int,
    version: str,
    queues: Sequence[str],
    kinds: Sequence[str],
    concurrency: int,
) -> None:
    conn.execute(
        text(
            "INSERT INTO worker_processes (id, node, hostname, pid, version, queues, kinds,"
            " concurrency) VALUES (:id, :node, :host, :pid, :version, :queues, :kinds, :conc)"
            " ON CONFLICT (id) DO UPDATE SET node = excluded.node, version = excluded.version,"
            " queues = excluded.queues, kinds = excluded.kinds, concurrency = excluded.concurrency,"
            " running = 0, processed = 0, failed = 0, started_at = now(), last_seen_at = now(),"
            " stopped_at = NULL"
        ),
        {"id": process_id, "node": node, "host": hostname, "pid": pid, "version": version,
         "queues": list(queues), "kinds": list(kinds), "conc": concurrency},
    )


def heartbeat(conn: Connection, process_id: str, *, running: int, processed: int, failed: int) -> None:
    conn.execute(
        text("UPDATE worker_processes SET last_seen_at = now(), running = :running,"
             " processed = :processed, failed = :failed WHERE id = :id"),
        {"id": process_id, "running": running, "processed": processed, "failed": failed},
    )


def stopped(conn: Connection, process_id: str) -> None:
    conn.execute(text("UPDATE worker_processes SET stopped_at = now(), running = 0 WHERE id = :id"),
                 {"id": process_id})
