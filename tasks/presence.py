"""Worker presence: every process that runs jobs registers itself and heartbeats its counts
into ``worker_processes``. The dashboard shows a process offline after
``SPACEJOBS_WORKER_OFFLINE_AFTER`` seconds of silence (default 30), e.g. after a SIGKILL."""

from __future__ import annotations

import logging
import os
import socket
import threading
from importlib.metadata import PackageNotFoundError, version

from spacejobs.models.db.transaction import transaction
from spacejobs.models.kinds import registered_kinds
from spacejobs.models.ops import presence
from spacejobs.tasks.worker_process import WorkerProcess

log = logging.getLogger("spacejobs.presence")


def _version() -> str:
    try:
        return version("spacejobs")
    except PackageNotFoundError:
        return "unknown"


def start(process: WorkerProcess, node: str) -> None:
    """Register this process and heartbeat in the background (idempotent per process)."""
    if process.presence_started:
        return
    process.presence_started = True
    threading.Thread(target=_loop, args=(process, node), name="presence", daemon=True).start()


def stop(process: WorkerProcess) -> None:
    process.presence_stop.set()
    try:
        with transaction(process.engine) as conn:
            presence.stopped(conn, process.name)
    except Exception:
        log.warning("could not mark this worker process stopped")


def _loop(process: WorkerProcess, node: str) -> None:
    registered = False
    stats = process.stats
    while True:
        try:
            with transaction(process.engine) as conn:
                if not registered:
                    presence.register(
                        conn, process_id=process.name, node=node,
                        hostname=socket.gethostname(), pid=os.getpid(), version=_version(),
                        queues=[process.settings.queue],
                        kinds=sorted(registered_kinds()), concurrency=1)
                    registered = True
                else:
                    presence.heartbeat(conn, process.name, running=stats.running,
                                       processed=stats.processed, failed=stats.failed)
        except Exception:
            log.warning("presence heartbeat failed; will retry")
        if process.presence_stop.wait(process.settings.presence_interval):
            return
