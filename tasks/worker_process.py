"""What one worker process holds: its engine and name, its store adapter, its heartbeat, its
counts and its counter buffer. Created lazily, and forgotten after a fork: Celery's prefork
children each build their own (a parent's sockets and threads are not theirs)."""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

import psycopg
from sqlalchemy import Engine

from models.db.engine import make_engine
from models.db.roles import WORKER_ROLE, listen_url, role_url
from models.jobs.leases import WorkerLeases
from models.ops.counters import BufferedCounters
from models.results.configured import open_store
from models.results.store import ResultStore
from models.settings import get_settings
from tasks import shutdown
from tasks.heartbeat import LeaseKeeper
from tasks.runner import Ring, Stats

log = logging.getLogger("spacejobs.worker")

#: the channel the jobs table's insert trigger notifies (models/db/schema.sql jobs_after_insert)
JOBS_CHANNEL = "spacejobs_jobs"

_engine: Engine | None = None
_listener: psycopg.Connection | None = None
_leases: WorkerLeases | None = None
_keeper: LeaseKeeper | None = None
_controls: tuple[float, list[Any]] | None = None
_results: ResultStore | None = None

#: a pause or a new limit reaches every worker within this many seconds
CONTROLS_TTL = 1.0

STATS = Stats()
#: this process's turn among the organizations, kept from one wake-up to the next
RING = Ring()


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def engine() -> Engine:
    global _engine
    if _engine is None:
        # The worker's name in pg_stat_activity lets an operator find (or cut) one process.
        _engine = make_engine(role_url(WORKER_ROLE), pool_size=2,
                              application_name=f"spacejobs-worker:{worker_name()}")
    return _engine


def leases() -> WorkerLeases:
    global _leases
    if _leases is None:
        _leases = WorkerLeases(engine(), worker_name())
    return _leases


def results() -> ResultStore:
    """The results store (a client per process: an S3 client is not shared across a fork)."""
    global _results
    if _results is None:
        _results = open_store(get_settings())
    return _results


def keeper() -> LeaseKeeper:
    global _keeper
    if _keeper is None:
        _keeper = LeaseKeeper(leases().extend, leases().fail)
    return _keeper


def controls() -> list[Any]:
    """Operator controls, re-read at most once a second per process (not once per claim)."""
    global _controls
    now = time.monotonic()
    if _controls is None or now - _controls[0] > CONTROLS_TTL:
        _controls = (now, leases().claim_controls())
    return _controls[1]


def wait_for_work(seconds: float) -> bool:
    """Wait for a job to be inserted (a NOTIFY), at most ``seconds``; False when none came, the
    worker is stopping, the database cannot be reached (the broker's wake-ups still come), or
    this process may not LISTEN (behind a transaction-mode pooler with no direct URL: no linger)."""
    global _listener
    deadline = time.monotonic() + seconds
    url = listen_url(role_url(WORKER_ROLE))
    if url is None:
        return False
    try:
        if _listener is None:
            _listener = psycopg.connect(url, autocommit=True,
                                        application_name=f"spacejobs-listen:{worker_name()}")
            _listener.execute(f"LISTEN {JOBS_CHANNEL}")
            # A job committed between the claim that found the queue empty and this LISTEN
            # notified nobody: claim once more before the first wait (later waits keep the
            # LISTEN, whose notifications queue up while the process runs jobs).
            return True
        while (left := deadline - time.monotonic()) > 0 and not shutdown.stop_requested():
            for _ in _listener.notifies(timeout=min(left, 0.2), stop_after=1):
                return True
    except psycopg.Error:
        log.warning("listening for new jobs failed; the broker's wake-ups remain")
        if _listener is not None:
            _listener.close()
        _listener = None
    return False


def _forget_parent() -> None:
    global _engine, _leases, _keeper, _controls, _listener, _results
    if _engine is not None:
        _engine.dispose(close=False)  # the parent's sockets are not ours to close
    _engine = _leases = _keeper = _controls = _listener = _results = None
    STATS.__init__()  # presence holds a reference to this object: reset it in place
    RING.__init__()


os.register_at_fork(after_in_child=_forget_parent)

# One buffer (and one flush thread) per worker process, shared by the runner and the sweeper.
COUNTERS = BufferedCounters(engine)
