"""Graceful shutdown of a worker process.

On SIGTERM a worker stops claiming, lets running jobs go on for ``SPACEJOBS_SHUTDOWN_GRACE``
seconds, and then gives back (``release``: queued again, attempt not burned) whatever has not
finished, at the job's next checkpoint, so another worker takes it at once instead of after the
lease expires. SIGKILL needs no cooperation: the lease expires and the sweeper takes over.

Celery's prefork children would otherwise die on SIGTERM (billiard installs an exiting handler),
taking the running job down mid-flight; so a child that runs jobs installs its own handler, and
the main process forwards its own shutdown to its children.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from types import FrameType

log = logging.getLogger("spacejobs.shutdown")

_main_pid = os.getpid()  # imported by the Celery main process before it forks its pool
_installed_in: int | None = None
_stop_at: float | None = None


def grace() -> float:
    return float(os.environ.get("SPACEJOBS_SHUTDOWN_GRACE", "20"))


def request_stop() -> None:
    """Stop claiming now; running jobs may continue for the grace period."""
    global _stop_at
    if _stop_at is None:
        _stop_at = time.monotonic() + grace()
        log.info("shutdown requested: no new claims, %.0fs grace for running jobs", grace())


def stop_requested() -> bool:
    return _stop_at is not None


def release_due() -> bool:
    """True once the grace period is over: running jobs should be given back."""
    return _stop_at is not None and time.monotonic() >= _stop_at


def install_in_pool_child() -> None:
    """Take over SIGTERM in a pool child (idempotent; a no-op in the main process)."""
    global _installed_in
    pid = os.getpid()
    if pid == _main_pid or _installed_in == pid:
        return

    def on_sigterm(_signum: int, _frame: FrameType | None) -> None:
        request_stop()

    signal.signal(signal.SIGTERM, on_sigterm)
    _installed_in = pid


def forward_to_children() -> None:
    """In the main process at warm shutdown: tell every pool child, and ourselves (solo pool)."""
    request_stop()
    try:
        import psutil

        children = psutil.Process().children()
    except Exception:
        return
    for child in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGTERM)

