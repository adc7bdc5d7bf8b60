"""One statement run again and again on a connection of its own, in a thread, while something
else happens: what a benchmark or a test samples from pg_stat_activity as it goes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg

from spacejobs.models.db.engine import libpq_url


class QuerySampler(threading.Thread):
    """Runs ``query`` every ``interval`` seconds (as ``url``'s role, in autocommit) from
    :meth:`start` until :meth:`stop`, handing each sample's rows to ``seen``; ``samples``
    counts them."""

    def __init__(self, url: str, query: str, seen: Callable[[list[tuple[Any, ...]]], None],
                 *, interval: float) -> None:
        super().__init__(daemon=True)
        self.url = libpq_url(url)
        self.query = query
        self.seen = seen
        self.interval = interval
        self.samples = 0
        self._done = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._done.wait(self.interval):
                self.seen(conn.execute(self.query).fetchall())
                self.samples += 1

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)
