"""Waiting for jobs to end without polling: one LISTEN per process, shared by every waiter.

A finishing job NOTIFYs ``spacejobs_finished`` with its id at COMMIT (jobs_after_update() in the
schema). A process keeps one listening connection and one thread that hands each id to whoever
waits for it. The row stays the truth: a waiter reads it before it waits (a job that ended
before the LISTEN began is seen there), after each notification, and every ``RECHECK`` seconds
in case a notification was lost with a broken connection.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from uuid import UUID

import psycopg

from spacejobs.models.db.engine import with_connection_options

log = logging.getLogger("spacejobs.waiting")

CHANNEL = "spacejobs_finished"
#: the longest a waiter goes without reading the row itself
RECHECK = 5.0


class FinishListener:
    """One per process and database: a thread that LISTENs and wakes the waiters of each id."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._waiters: dict[UUID, list[threading.Event]] = defaultdict(list)
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="finish-listener", daemon=True)
        self._thread.start()

    def register(self, job_id: UUID) -> threading.Event:
        """An event set when ``job_id`` is announced finished; call :meth:`forget` when done."""
        event = threading.Event()
        with self._lock:
            self._waiters[job_id].append(event)
        return event

    def forget(self, job_id: UUID, event: threading.Event) -> None:
        with self._lock:
            events = self._waiters.get(job_id, [])
            if event in events:
                events.remove(event)
            if not events:
                self._waiters.pop(job_id, None)

    def ready(self, timeout: float) -> bool:
        """Whether the LISTEN is in place (so that a finish from now on is announced)."""
        return self._ready.wait(timeout)

    def close(self) -> None:
        """Stop listening and end the thread (within about a second)."""
        self._closed.set()
        self._thread.join(timeout=5)

    def _listen(self) -> None:
        failing = False
        while not self._closed.is_set():
            try:
                with psycopg.connect(with_connection_options(self._conninfo), autocommit=True,
                                     application_name="spacejobs-wait") as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._ready.set()
                    failing = False
                    self._wake_everyone()  # anything missed while reconnecting: re-read
                    while not self._closed.is_set():
                        for notice in conn.notifies(timeout=1.0):
                            self._announce(notice.payload)
            except psycopg.Error:
                if not failing:  # once per outage, not once per retry
                    log.warning("listening for finished jobs failed; waiters re-read their jobs")
                failing = True
            self._ready.clear()
            self._wake_everyone()
            self._closed.wait(1.0)

    def _announce(self, payload: str) -> None:
        with self._lock:
            for text in payload.split(","):
                try:
                    job_id = UUID(text)
                except ValueError:
                    continue
                for event in self._waiters.get(job_id, ()):
                    event.set()

    def _wake_everyone(self) -> None:
        with self._lock:
            for events in self._waiters.values():
                for event in events:
                    event.set()


class Unheard:
    """The listener of a process that may not LISTEN (behind a transaction-mode pooler with no
    direct URL): nothing is announced, so each waiter re-reads its job every ``RECHECK``."""

    def register(self, job_id: UUID) -> threading.Event:
        return threading.Event()

    def forget(self, job_id: UUID, event: threading.Event) -> None:
        pass

    def ready(self, timeout: float) -> bool:
        return False

    def close(self) -> None:
        pass


def listener(conninfo: str | None) -> FinishListener | Unheard:
    """A listener for the database at ``conninfo`` (its thread starts on first use); an
    :class:`Unheard` one when this process may not LISTEN (models.db.roles.listen_url). Its
    owner keeps it for the process (models.jobs.service.Jobs holds one)."""
    if conninfo is None:
        return Unheard()
    return FinishListener(conninfo)
