"""The worker role's engine and name, one per process (created lazily, never shared across a
fork: Celery's prefork children each get their own)."""

from __future__ import annotations

import os
import socket

from sqlalchemy import Engine

from models.db.engine import make_engine
from models.db.roles import WORKER_ROLE, role_url
from models.ops.counters import BufferedCounters

_engine: Engine | None = None


def engine() -> Engine:
    global _engine
    if _engine is None:
        # The worker's name in pg_stat_activity lets an operator find (or cut) one process.
        _engine = make_engine(role_url(WORKER_ROLE), pool_size=2,
                              application_name=f"spacejobs-worker:{worker_name()}")
    return _engine


def _forget_parent_engine() -> None:
    global _engine
    if _engine is not None:
        # In a forked child the parent's sockets are not ours to close.
        _engine.dispose(close=False)
    _engine = None


os.register_at_fork(after_in_child=_forget_parent_engine)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# One buffer (and one flush thread) per worker process, shared by the runner and the sweeper.
COUNTERS = BufferedCounters(engine)
