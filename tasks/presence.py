"""Worker presence: every process that runs jobs registers itself and heartbeats its counts
into ``worker_processes``. The dashboard shows a process offline after
``SPACEJOBS_WORKER_OFFLINE_AFTER`` seconds of silence (default 30), e.g. after a SIGKILL."""

from __future__ import annotations

import logging
import os
import socket
import threading
from importlib.metadata import PackageNotFoundError, version

from models.db.transaction import transaction
from models.kinds import load_kinds
from models.ops import presence
from models.settings import get_settings
from tasks import worker_process
from tasks.worker_process import STATS

log = logging.getLogger("spacejobs.presence")


_started = False
_stop = threading.Event()


def _forget_parent() -> None:
    # A forked child runs no presence thread and has processed nothing yet.
    global _started, _stop
    _started = False
    _stop = threading.Event()


os.register_at_fork(after_in_child=_forget_parent)


def _version() -> str:
    try:
        return version("spacejobs")
    except PackageNotFoundError:
        return "unknown"


def start(node: str) -> None:
    """Register this process and heartbeat in the background (idempotent per process)."""
    global _started
    if _started:
        return
    _started = True
    threading.Thread(target=_loop, args=(node,), name="presence", daemon=True).start()


def stop() -> None:
    _stop.set()
    try:
        with transaction(worker_process.engine()) as conn:
            presence.stopped(conn, worker_process.worker_name())
    except Exception:
        log.warning("could not mark this worker process stopped")


def _loop(node: str) -> None:
    registered = False
    while True:
        try:
            with transaction(worker_process.engine()) as conn:
                if not registered:
                    presence.register(
                        conn, process_id=worker_process.worker_name(), node=node,
                        hostname=socket.gethostname(), pid=os.getpid(), version=_version(),
                        queues=[get_settings().queue],
                        kinds=sorted(load_kinds()), concurrency=1)
                    registered = True
                else:
                    presence.heartbeat(conn, worker_process.worker_name(), running=STATS.running,
                                       processed=STATS.processed, failed=STATS.failed)
        except Exception:
            log.warning("presence heartbeat failed; will retry")
        if _stop.wait(get_settings().presence_interval):
            return
