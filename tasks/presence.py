"""Worker presence: every process that runs jobs registers itself and heartbeats its counts
into ``worker_processes``. The dashboard shows a process offline after
``SPACEJOBS_WORKER_OFFLINE_AFTER`` seconds of silence (default 30), e.g. after a SIGKILL."""

from __future__ import annotations

import logging
import os
import socket
import threading
from importlib.metadata import PackageNotFoundError, version

from models import presence
from models.db import transaction
from models.kinds import load_kinds
from tasks import worker_db

log = logging.getLogger("spacejobs.presence")


class Stats:
    """This process's job counts, updated by the runner (one job at a time per process)."""

    def __init__(self) -> None:
        self.running = 0
        self.processed = 0
        self.failed = 0


STATS = Stats()
_started_in: int | None = None
_stop = threading.Event()


def interval() -> float:
    return float(os.environ.get("SPACEJOBS_PRESENCE_INTERVAL", "5"))


def _version() -> str:
    try:
        return version("spacejobs")
    except PackageNotFoundError:
        return "unknown"


def start(node: str) -> None:
    """Register this process and heartbeat in the background (idempotent per process)."""
    global _started_in
    if _started_in == os.getpid():
        return
    _started_in = os.getpid()
    _stop.clear()
    threading.Thread(target=_loop, args=(node,), name="presence", daemon=True).start()


def stop() -> None:
    _stop.set()
    try:
        with transaction(worker_db.engine()) as conn:
            presence.stopped(conn, worker_db.worker_name())
    except Exception:
        log.warning("could not mark this worker process stopped")


def _loop(node: str) -> None:
    registered = False
    while True:
        try:
            with transaction(worker_db.engine()) as conn:
                if not registered:
                    presence.register(
                        conn, process_id=worker_db.worker_name(), node=node,
                        hostname=socket.gethostname(), pid=os.getpid(), version=_version(),
                        queues=[os.environ.get("SPACEJOBS_QUEUE", "spacejobs")],
                        kinds=sorted(load_kinds()), concurrency=1)
                    registered = True
                else:
                    presence.heartbeat(conn, worker_db.worker_name(), running=STATS.running,
                                       processed=STATS.processed, failed=STATS.failed)
        except Exception:
            log.warning("presence heartbeat failed; will retry")
        if _stop.wait(interval()):
            return
