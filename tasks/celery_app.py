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

from models.logs import configure_logging
from tasks import presence, runner, shutdown, sweeper, worker_db
from tasks.wakeups import SWEEP_TASK, WAKE_TASK, WakeupPublisher

app = Celery("spacejobs")
app.config_from_object("celeryconfig")

log = logging.getLogger("spacejobs.tasks")

# Every wake-up a worker sends (a retry, a release at shutdown, the sweeper's re-signals) goes
# through the same publisher as the web's, counted in this process's buffer.
publisher = WakeupPublisher(counters=worker_db.COUNTERS, celery=app)


@app.task(name=WAKE_TASK, ignore_result=True, bind=True)
def wake(self: Any, job_id: str | None = None) -> int:
    """Claim and run due jobs, up to the drain limit. A surplus wake-up finds nothing: cheap."""
    presence.start(self.request.hostname or "unknown")  # solo pools have no process_init
    return runner.drain(publish_wake=publisher.wake)


@app.task(name=SWEEP_TASK, ignore_result=True)
def sweep() -> dict[str, int]:
    return sweeper.sweep_once(publish_wake=publisher.wake).as_dict()


@worker_process_init.connect
def _register_pool_process(sender: object = None, **_: object) -> None:
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
