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
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("spacejobs.shutdown")


class Shutdown:
    """One process's shutdown state: when its running jobs must be given back."""

    def __init__(self, *, grace: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace = grace
        self._clock = clock
        self._stop_at: float | None = None
        self._installed = False

    def request_stop(self) -> None:
        """Stop claiming now; running jobs may continue for the grace period."""
        if self._stop_at is None:
            self._stop_at = self._clock() + self.grace
            log.info("shutdown requested: no new claims, %.0fs grace for running jobs", self.grace)

    def stop_requested(self) -> bool:
        return self._stop_at is not None

    def release_due(self) -> bool:
        """True once the grace period is over: running jobs should be given back."""
        return self._stop_at is not None and self._clock() >= self._stop_at

    def ignore_until_installed(self) -> None:
        """In a new pool child, before billiard resets its signals: ignore SIGTERM until
        :meth:`install_in_pool_child` takes it over at the first task.

        Billiard replaces any Python handler a child has at its start with one that exits, but
        leaves an ignored signal ignored. A job the floor's thread runs before any task (a
        signal handler can only be set from the main thread) would otherwise die with the
        child on SIGTERM, its lease held until it expires; ignored, the child hears of the
        shutdown when the main process closes the pool, and the floor's drain gives the job
        back after the grace (tasks/celery_app.py, ``_mark_stopped``)."""
        if not self._installed:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def install_in_pool_child(self) -> None:
        """Take over SIGTERM in a pool child (idempotent). Only a pool child calls it: the
        main process keeps Celery's own handler, which forwards to the children."""
        if self._installed:
            return

        def on_sigterm(_signum: int, _frame: FrameType | None) -> None:
            self.request_stop()

        signal.signal(signal.SIGTERM, on_sigterm)
        self._installed = True

    def forward_to_children(self) -> None:
        """In the main process at warm shutdown: tell every pool child, and ourselves (solo pool)."""
        self.request_stop()
        try:
            import psutil

            children = psutil.Process().children()
        except Exception:
            return
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)
