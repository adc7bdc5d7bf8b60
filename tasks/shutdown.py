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

from models.settings import get_settings

log = logging.getLogger("spacejobs.shutdown")

_in_forked_child = False  # True in a Celery pool child (the main process imports us first)
_installed = False
_stop_at: float | None = None


def _forked() -> None:
    global _in_forked_child, _installed, _stop_at
    _in_forked_child, _installed, _stop_at = True, False, None


os.register_at_fork(after_in_child=_forked)


def grace() -> float:
    return get_settings().shutdown_grace


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
    global _installed
    if not _in_forked_child or _installed:
        return

    def on_sigterm(_signum: int, _frame: FrameType | None) -> None:
        request_stop()

    signal.signal(signal.SIGTERM, on_sigterm)
    _installed = True


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

