"""Worker presence: each worker process registers and heartbeats its own row."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection

from spacejobs.models.db.queries import queries_beside

Q = queries_beside(__file__)


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
    conn.execute(Q["register"], {"id": process_id, "node": node, "host": hostname, "pid": pid,
                                 "version": version, "queues": list(queues), "kinds": list(kinds),
                                 "concurrency": concurrency})


def heartbeat(conn: Connection, process_id: str, *, running: int, processed: int, failed: int) -> None:
    conn.execute(Q["heartbeat"], {"id": process_id, "running": running, "processed": processed,
                                  "failed": failed})


def stopped(conn: Connection, process_id: str) -> None:
    conn.execute(Q["stopped"], {"id": process_id})
