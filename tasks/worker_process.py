"""What one worker process holds, built once per process from the settings: its name and
engine, its store adapter, its heartbeat and its long-job watch, its counts and counter buffer,
its wake-up publisher and job API, its operator controls cache, its listener for new jobs, its
drains and their floor, its shutdown state.

Celery's process model forces one handle per process: a task body is a module function that
Celery calls with no place to pass state, and a prefork child inherits its parent's memory. So
:func:`current` is that handle, built on first use and dropped after a fork (a parent's sockets
and threads are not the child's), and nothing else in ``tasks/`` keeps state in a module.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from uuid import UUID

import psycopg
from celery import Celery

from spacejobs.models import tracing
from spacejobs.models.db.engine import make_engine, with_connection_options
from spacejobs.models.db.roles import WORKER_ROLE, listen_url, role_url
from spacejobs.models.jobs.records import KindControl
from spacejobs.models.jobs.service import Jobs
from spacejobs.models.ops.counters import BufferedCounters
from spacejobs.models.results.configured import open_store
from spacejobs.models.results.store import ResultStore
from spacejobs.models.settings import Settings, get_settings
from spacejobs.tasks.engine.floor import Drains, Floor
from spacejobs.tasks.engine.heartbeat import LeaseKeeper
from spacejobs.tasks.engine.held import LongJobWatch
from spacejobs.tasks.engine.leases import WorkerLeases
from spacejobs.tasks.engine.runner import Ring, Stats
from spacejobs.tasks.engine.tracing import NO_SPANS, AttemptSpans, NoSpans
from spacejobs.tasks.shutdown import Shutdown
from spacejobs.tasks.wakeups import WakeupPublisher

log = logging.getLogger("spacejobs.worker")

#: the channel the jobs table's insert trigger notifies (jobs_after_insert, in
#: models/db/schema/40_job_transitions.sql)
JOBS_CHANNEL = "spacejobs_jobs"

def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class WorkerProcess:
    """One worker (or beat) process's wiring. Its parts connect lazily: building it opens
    nothing, and a part that needs the broker or the database reaches it on first use."""

    def __init__(self, settings: Settings, *, celery: Celery | None = None) -> None:
        self.settings = settings
        self.name = worker_name()
        # Before the engine: its statements are traced from the start when this process traces.
        self.spans = start_tracing(settings, lambda ids: self.leases.traceparents(ids))
        # The worker's name in pg_stat_activity lets an operator find (or cut) one process.
        self.engine = make_engine(role_url(WORKER_ROLE), pool_size=2,
                                  application_name=f"spacejobs-worker:{self.name}")
        self.leases = WorkerLeases(self.engine, self.name)
        self.keeper = LeaseKeeper(self.leases.extend, self.leases.fail,
                                  cancels_asked=self.leases.cancels_asked,
                                  cancel_check=settings.cancel_check_interval)
        #: gives back what a drain holds behind a long job (one thread, started on first use)
        self.long_job_watch = LongJobWatch()
        self.stats = Stats()
        #: this process's turn among the organizations, kept from one wake-up to the next
        self.ring = Ring()
        # One buffer (and one flush thread) per process, shared by the runner and beat's chores.
        self.counters = BufferedCounters(lambda: self.engine)
        # Every wake-up this process sends (a retry, a release at shutdown, the chores'
        # re-signals, a task's submit) goes through one publisher, counted in this buffer.
        self.publisher = WakeupPublisher(counters=self.counters, celery=celery)
        #: the job API for tasks that submit jobs (beat's periodic jobs, application tasks)
        self.jobs = Jobs(self.engine, wake=self.publisher.wake)
        self.shutdown = Shutdown(grace=settings.shutdown_grace)
        #: a Celery pool child (worker_process_init says so), which takes over SIGTERM
        self.pool_child = False
        self.presence_stop = threading.Event()
        self.presence_started = False
        self._results: ResultStore | None = None
        self._controls: tuple[float, list[KindControl]] | None = None
        #: a pause or a new limit reaches this process within this many seconds
        self._controls_ttl = settings.controls_ttl
        self._listener: psycopg.Connection | None = None
        #: this process's drains, one at a time, whoever starts them (a wake-up, the floor)
        self.drains = Drains()
        #: a pool child's floor under the broker's wake-ups (tasks/floor.py), once started
        self.floor: Floor | None = None

    def results(self) -> ResultStore:
        """The results store (a client per process: an S3 client is not shared across a fork)."""
        if self._results is None:
            self._results = open_store(self.settings)
        return self._results

    def controls(self) -> list[KindControl]:
        """Operator controls, re-read at most once per ``SPACEJOBS_CONTROLS_TTL`` seconds per
        process (not once per claim)."""
        now = time.monotonic()
        if self._controls is None or now - self._controls[0] > self._controls_ttl:
            self._controls = (now, self.leases.claim_controls())
        return self._controls[1]

    def wait_for_work(self, seconds: float) -> bool:
        """Wait for a job to be inserted (a NOTIFY), at most ``seconds``; False when none came,
        the worker is stopping, the database cannot be reached (the broker's wake-ups still
        come), or this process may not LISTEN (behind a transaction-mode pooler with no direct
        URL: no linger)."""
        deadline = time.monotonic() + seconds
        url = listen_url(role_url(WORKER_ROLE))
        if url is None:
            return False
        try:
            if self._listener is None:
                self._listener = psycopg.connect(with_connection_options(url), autocommit=True,
                                                 application_name=f"spacejobs-listen:{self.name}")
                self._listener.execute(f"LISTEN {JOBS_CHANNEL}")
                # A job committed between the claim that found the queue empty and this LISTEN
                # notified nobody: claim once more before the first wait (later waits keep the
                # LISTEN, whose notifications queue up while the process runs jobs).
                return True
            while (left := deadline - time.monotonic()) > 0 and not self.shutdown.stop_requested():
                for _ in self._listener.notifies(timeout=min(left, 0.2), stop_after=1):
                    return True
        except psycopg.Error:
            log.warning("listening for new jobs failed; the broker's wake-ups remain")
            self.stop_listening()
        return False

    def stop_listening(self) -> None:
        if self._listener is not None:
            self._listener.close()
        self._listener = None

    def forget_parent(self) -> None:
        """In a forked child: the parent's sockets are not ours to close, only to drop."""
        self.engine.dispose(close=False)


_current: WorkerProcess | None = None


def current() -> WorkerProcess:
    """This process's wiring, built on first use from the settings."""
    global _current
    if _current is None:
        _current = WorkerProcess(get_settings())
    return _current


def _forget_parent() -> None:
    global _current
    if _current is not None:
        _current.forget_parent()
    _current = None


os.register_at_fork(after_in_child=_forget_parent)


def start_tracing(settings: Settings, traceparents: Callable[[Sequence[UUID]], dict[UUID, str]],
                  service_name: str = "spacejobs-worker") -> NoSpans:
    """A worker (or beat) process's spans: tracing set up once for the process when the
    ``OTEL_*`` variables ask for it, Celery's publish and run spans included."""
    if not tracing.configure(settings, service_name):
        return NO_SPANS
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    CeleryInstrumentor().instrument()  # once per process; a forked child keeps its hooks
    found = tracing.tracer()
    assert found is not None
    return AttemptSpans(found, traceparents)
