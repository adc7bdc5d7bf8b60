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

from models.jobs import service
from models.kinds import load_kinds
from models.logs import configure_logging
from models.settings import get_settings
from tasks import presence, shutdown, sweeper, worker_process
from tasks.runner import BatchSize, Runner
from tasks.task_failures import reported_without_messages
from tasks.wakeups import SWEEP_TASK, WAKE_TASK, WakeupPublisher

app = Celery("spacejobs")
app.config_from_object("celeryconfig")

log = logging.getLogger("spacejobs.tasks")

# Every wake-up a worker sends (a retry, a release at shutdown, the sweeper's re-signals) goes
# through the same publisher as the web's, counted in this process's buffer.
publisher = WakeupPublisher(counters=worker_process.COUNTERS, celery=app)
# A task that submits jobs (models.jobs.service) wakes workers through the same publisher.
service.configure(wake=publisher.wake)


def _publish_quietly(job_id: str | None = None, *, countdown: float | None = None) -> None:
    publisher.wake(job_id, countdown=countdown, force=True)


def make_runner() -> Runner:
    settings = get_settings()
    return Runner(
        leases=worker_process.leases(),
        keeper=worker_process.keeper(),
        stats=worker_process.STATS,
        batch=BatchSize(settings.claim_batch),
        controls=worker_process.controls,
        publish_wake=_publish_quietly,
        stop_requested=shutdown.stop_requested,
        release_due=shutdown.release_due,
        count=lambda name, kind: worker_process.COUNTERS.add(name, kind),
        linger=settings.linger_seconds,
        wait_for_work=worker_process.wait_for_work,
        fan_out=publisher.wake,
        ring=worker_process.RING,
        results=worker_process.results(),
        inline_max_bytes=settings.result_inline_max_bytes,
    )


@app.task(name=WAKE_TASK, ignore_result=True, bind=True)
@reported_without_messages
def wake(self: Any, job_id: str | None = None) -> int:
    """Claim and run due jobs until none is left. A surplus wake-up finds nothing: cheap."""
    presence.start(self.request.hostname or "unknown")  # solo pools have no process_init
    load_kinds()
    shutdown.install_in_pool_child()
    # From here on, a submit that commits sends a new wake-up: whatever committed before is
    # seen by the claims below (the coalescing guard, see tasks/wakeups.py).
    publisher.awake()
    return make_runner().drain(get_settings().drain_limit)


@app.task(name=SWEEP_TASK, ignore_result=True)
@reported_without_messages
def sweep() -> dict[str, int]:
    """A sweep on demand (`celery call spacejobs.sweep`); beat runs its own (tasks/beat.py)."""
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
