"""The worker role's engine, one per process (created lazily, never shared across a fork)."""

from __future__ import annotations

import os
import socket

from sqlalchemy import Engine

from models.counters import BufferedCounters
from models.db import WORKER_ROLE, make_engine, role_url

_engine: Engine | None = None
_pid: int | None = None


def engine() -> Engine:
    global _engine, _pid
    if _engine is None or _pid != os.getpid():
        # The worker's name in pg_stat_activity lets an operator find (or cut) one process.
        _engine = make_engine(role_url(WORKER_ROLE), pool_size=2,
                              application_name=f"spacejobs-worker:{worker_name()}")
        _pid = os.getpid()
    return _engine


def reset() -> None:
    global _engine, _pid
    if _engine is not None:
        # In a forked child the parent's sockets are not ours to close.
        _engine.dispose(close=_pid == os.getpid())
    _engine, _pid = None, None


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# One buffer (and one flush thread) per worker process, shared by the runner and the sweeper.
COUNTERS = BufferedCounters(engine)
