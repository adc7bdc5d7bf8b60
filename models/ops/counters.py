"""Counters bumped from Python: wake-ups published and failed (stale finishes are counted by the
database itself, under their kinds: complete_jobs() in the schema).

Buffered in the process and flushed every few seconds, so a busy process adds one small write
per flush, not one per event. A process killed before its flush loses at most those seconds of
counts; the job rows themselves are never affected.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Callable

from sqlalchemy import Engine

from spacejobs.models.db.queries import queries_beside
from spacejobs.models.db.transaction import transaction

log = logging.getLogger("spacejobs.counters")

Q = queries_beside(__file__)

WAKEUPS_PUBLISHED = "spacejobs_wakeups_published_total"
WAKEUPS_FAILED = "spacejobs_wakeups_failed_total"


class BufferedCounters:
    def __init__(self, engine: Callable[[], Engine], *, interval: float = 5.0) -> None:
        self._engine = engine
        self._interval = interval
        self._pending: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._flusher: threading.Thread | None = None
        self._failing = False  # warn once per outage, not at every flush
        # A forked child has no flush thread, and the parent's pending counts are the parent's.
        os.register_at_fork(after_in_child=self._forget_parent)

    def add(self, name: str, by: int = 1) -> None:
        if not by:
            return
        with self._lock:
            self._pending[name] += by
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._loop, name="counter-flush", daemon=True)
                self._flusher.start()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, Counter()
        if not pending:
            return
        try:
            with transaction(self._engine()) as conn:
                for name, value in pending.items():
                    conn.execute(Q["count_event"], {"name": name, "by": value})
        except Exception:
            with self._lock:
                self._pending.update(pending)  # try again at the next flush
            if not self._failing:
                log.warning("metric counters not flushed; will retry")
            self._failing = True
        else:
            self._failing = False

    def _forget_parent(self) -> None:
        self._lock = threading.Lock()
        self._pending = Counter()
        self._flusher = None

    def _loop(self) -> None:
        while True:
            threading.Event().wait(self._interval)
            self.flush()
