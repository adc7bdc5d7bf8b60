"""Counters bumped from Python (wake-ups published and failed, stale finishes fenced).

Buffered in the process and flushed every few seconds, so a busy web process adds one small
write per flush, not one per submit. A process killed before its flush loses at most those
seconds of counts; the job rows themselves are never affected.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter

from sqlalchemy import Engine, text

from models.db import transaction

log = logging.getLogger("spacejobs.counters")

STALE_FINISHES = "spacejobs_stale_finishes_fenced_total"
WAKEUPS_PUBLISHED = "spacejobs_wakeups_published_total"
WAKEUPS_FAILED = "spacejobs_wakeups_failed_total"


class BufferedCounters:
    def __init__(self, engine_factory: object, *, interval: float = 5.0) -> None:
        self._engine_factory = engine_factory
        self._interval = interval
        self._pending: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._thread_pid: int | None = None

    def add(self, name: str, kind: str = "", by: float = 1) -> None:
        if not by:
            return
        with self._lock:
            self._pending[(name, kind)] += by
        if self._thread_pid != os.getpid():  # a fork leaves the parent's thread behind
            self._thread_pid = os.getpid()
            threading.Thread(target=self._loop, name="counter-flush", daemon=True).start()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, Counter()
        if not pending:
            return
        engine: Engine = self._engine_factory()  # type: ignore[operator]
        try:
            with transaction(engine) as conn:
                for (name, kind), value in pending.items():
                    conn.execute(text("SELECT count_event(:name, :kind, :by)"),
                                 {"name": name, "kind": kind, "by": value})
        except Exception:
            with self._lock:
                self._pending.update(pending)  # try again at the next flush
            log.warning("metric counters not flushed; will retry")

    def _loop(self) -> None:
        me = os.getpid()
        while self._thread_pid == me:
            threading.Event().wait(self._interval)
            self.flush()
