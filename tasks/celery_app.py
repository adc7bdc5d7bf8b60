"""The Celery app and its two tasks. Both are thin: the work is in runner and sweeper."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import (
    setup_logging,
    worker_process_init,
    worker_process_shutdown,
    worker_shutting_down,
)

from models import counters
from models.logsetup import configure_logging
from tasks import presence, runner, shutdown, sweeper, worker_db

app = Celery("spacejobs")
app.config_from_object("celeryconfig")

WAKE_TASK = "spacejobs.wake"
SWEEP_TASK = "spacejobs.sweep"

log = logging.getLogger("spacejobs.tasks")


def publish_wake(job_id: str | None = None, countdown: float | None = None) -> None:
    """A wake-up signal; losing it costs latency only (the sweeper re-sends). Every wake-up a
    worker sends goes through here, so this is where it is counted."""
    try:
        app.send_task(WAKE_TASK, kwargs={"job_id": job_id}, countdown=countdown, retry=False)
    except Exception:
        worker_db.COUNTERS.add(counters.WAKEUPS_FAILED)
        raise
    worker_db.COUNTERS.add(counters.WAKEUPS_PUBLISHED)


@app.task(name=WAKE_TASK, ignore_result=True, bind=True)
def wake(self: Any, job_id: str | None = None) -> int:
    """Claim and run due jobs, up to the drain limit. A surplus wake-up finds nothing: cheap."""
    presence.start(self.request.hostname or "unknown")  # solo pools have no process_init
    return runner.drain(publish_wake=publish_wake)


@app.task(name=SWEEP_TASK, ignore_result=True)
def sweep() -> dict[str, int]:
    return sweeper.sweep_once(publish_wake=publish_wake).as_dict()


@worker_process_init.connect
def _fresh_connections_after_fork(sender: object = None, **_: object) -> None:
    # A forked child must never reuse the parent's pooled sockets.
    runner.reset_engine()
    presence.start(str(sender or "unknown"))


@worker_process_shutdown.connect
def _mark_stopped(**_: object) -> None:
    presence.stop()


@worker_shutting_down.connect
def _graceful_shutdown(**_: object) -> None:
    shutdown.forward_to_children()


@setup_logging.connect
def _configure_logging(**_: object) -> None:
    # Our format (with job context) instead of Celery's; also stops Celery from hijacking it.
    configure_logging()
