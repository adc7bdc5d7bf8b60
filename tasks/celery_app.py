"""The Celery app and its two tasks. Both are thin: the work is in the runner and the
maintenance chores, and what they run with is this process's wiring
(tasks.worker_process.current())."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import (
    setup_logging,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_shutting_down,
)

from spacejobs.models.kinds import load_kinds
from spacejobs.models.logs import configure_logging
from spacejobs.tasks import health, maintenance, presence, worker_process
from spacejobs.tasks.engine.floor import Floor
from spacejobs.tasks.engine.runner import BatchSize, Ports, Runner, Signals, Tuning
from spacejobs.tasks.task_failures import reported_without_messages
from spacejobs.tasks.wakeups import SWEEP_TASK, WAKE_TASK

app = Celery("spacejobs")
app.config_from_object("spacejobs.celeryconfig")
# The worker's (and beat's) start: every kind the settings name is registered before a task runs.
load_kinds()

log = logging.getLogger("spacejobs.tasks")


def make_runner(process: worker_process.WorkerProcess) -> Runner:
    settings = process.settings
    shutdown = process.shutdown

    def publish_quietly(job_id: str | None = None, *, countdown: float | None = None) -> None:
        process.publisher.wake(job_id, countdown=countdown, force=True)

    return Runner(
        ports=Ports(leases=process.leases, keeper=process.keeper, controls=process.controls,
                    results=process.results(),
                    inline_max_bytes=settings.result_inline_max_bytes),
        signals=Signals(stop_requested=shutdown.stop_requested, release_due=shutdown.release_due,
                        wait_for_work=process.wait_for_work, publish_wake=publish_quietly,
                        fan_out=process.publisher.wake),
        tuning=Tuning(BatchSize(settings.claim_batch), linger=settings.linger_seconds),
        stats=process.stats,
        ring=process.ring,
        spans=process.spans,
        watch=process.long_job_watch,
    )


def drain(process: worker_process.WorkerProcess) -> int:
    """Claim and run due jobs until none is left (or the drain limit): what a wake-up and the
    floor both do."""
    return make_runner(process).drain(process.settings.drain_limit)


@app.task(name=WAKE_TASK, ignore_result=True, bind=True)
@reported_without_messages
def wake(self: Any, job_id: str | None = None) -> int:
    """Claim and run due jobs until none is left. A surplus wake-up finds nothing: cheap."""
    process = worker_process.current()
    presence.start(process, self.request.hostname or "unknown")  # solo pools have no process_init
    if process.pool_child:
        process.shutdown.install_in_pool_child()
    # From here on, a submit that commits sends a new wake-up: whatever committed before is
    # seen by the claims below (the coalescing guard, see tasks/wakeups.py).
    process.publisher.awake()
    # One drain at a time per process: if the floor drains now, this one follows it.
    return process.drains.run(lambda: drain(process)) or 0


@app.task(name=SWEEP_TASK, ignore_result=True)
@reported_without_messages
def sweep() -> dict[str, dict[str, int]]:
    """The sweep's chores once each, on demand (`celery call spacejobs.sweep`); beat runs every
    chore on its own cadence (tasks/beat.py)."""
    return maintenance.sweep_now(worker_process.current())


@worker_init.connect
def _start_health_probe(**_: object) -> None:
    process = worker_process.current()
    if process.settings.worker_health_port:
        health.serve(process.engine, process.settings)


@worker_process_init.connect
def _register_pool_process(sender: object = None, **_: object) -> None:
    process = worker_process.current()
    process.pool_child = True
    process.shutdown.ignore_until_installed()
    presence.start(process, str(sender or "unknown"))
    start_floor(process)


def start_floor(process: worker_process.WorkerProcess) -> Floor:
    """A pool child's floor (tasks/floor.py): it drains when the broker cannot be counted on."""
    settings = process.settings
    process.floor = Floor(
        process.drains, lambda: drain(process),
        broker_reachable=process.publisher.reachable,
        stopping=process.shutdown.stop_requested,
        interval=settings.floor_interval, idle_poll=settings.floor_idle_poll)
    process.floor.start()
    return process.floor


@worker_process_shutdown.connect
def _mark_stopped(**_: object) -> None:
    process = worker_process.current()
    if process.floor is not None:
        # A drain the floor runs stops claiming now and gives back, after the grace, what has
        # not finished, as a wake-up's drain does at shutdown.
        process.shutdown.request_stop()
        process.floor.stop(timeout=process.settings.shutdown_grace + 5)
    presence.stop(process)


@worker_shutting_down.connect
def _graceful_shutdown(**_: object) -> None:
    worker_process.current().shutdown.forward_to_children()


@setup_logging.connect
def _configure_logging(**_: object) -> None:
    # Our format (with job context) instead of Celery's; also stops Celery from hijacking it.
    configure_logging()
