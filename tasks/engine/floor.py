"""Jobs keep moving without Redis: each pool process's floor under the broker's wake-ups.

Redis is only a signal. A wake-up makes a pool process drain (claim and run due jobs until none
is left, then linger on PostgreSQL's LISTEN for the next submit's NOTIFY); without wake-ups a
process would sit idle beside a queue full of due jobs. So every prefork pool process runs one
small thread, the floor, that looks at the broker every ``SPACEJOBS_FLOOR_INTERVAL`` seconds:

- broker unreachable: the process drains by itself, round after round. Each drain claims what
  is due, runs it, and lingers on LISTEN, so a submit's NOTIFY starts its job at once and a claim
  at least every interval is the slow poll under it. This is also how a worker started while
  Redis is down does its work: Celery forks its pool before its consumer connects, and the
  floor needs nothing from Celery.
- broker reachable: the process drains by itself only after it has not drained for
  ``SPACEJOBS_FLOOR_IDLE_POLL`` seconds, so a consumer that is alive but hears nothing (lost
  messages, a wedged reconnect) costs latency, not progress. A claim that finds nothing is one
  indexed statement.

One drain at a time per process (:class:`Drains`): a wake-up that arrives while the floor
drains waits for it (and then finds little left), so a process never runs more jobs at once
than Celery's concurrency gives it. The drain is the same as a wake-up's, with the same claim,
fencing and finishes: the floor changes who starts a drain, never what a drain may do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("spacejobs.floor")


class Drains:
    """This process's drains, one at a time, and when the last one ended."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        #: when the last drain ended (clock time); None before the first
        self.last_ended: float | None = None

    def run(self, drain: Callable[[], int], *, wait: bool = True) -> int | None:
        """Run ``drain`` unless another drain of this process runs (``wait``: after it ends).
        None when it did not run."""
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            return drain()
        finally:
            self.last_ended = self._clock()
            self._lock.release()

    def idle_for(self) -> float:
        """Seconds since the last drain ended (infinite before the first)."""
        if self.last_ended is None:
            return float("inf")
        return self._clock() - self.last_ended


class Floor:
    """The thread that drains when the broker cannot be counted on (see the module's doc)."""

    def __init__(self, drains: Drains, drain: Callable[[], int], *,
                 broker_reachable: Callable[[], bool], stopping: Callable[[], bool],
                 interval: float, idle_poll: float) -> None:
        self._drains = drains
        self._drain = drain
        self._broker_reachable = broker_reachable
        self._stopping = stopping
        self._interval = interval
        self._idle_poll = idle_poll
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: whether the last look found the broker unreachable (logged once per outage)
        self.degraded = False

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="spacejobs-floor", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop looking; wait up to ``timeout`` for a drain the floor runs to end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if self._stopping():
                return
            try:
                self.round()
            except Exception:
                # A database outage: the next round tries again (the drain logs its own faults).
                log.exception("floor: a drain failed; trying again in %.1fs", self._interval)

    def round(self) -> int | None:
        """One look: drain if the broker is unreachable, or if this process has been idle for
        the idle poll. Returns the jobs the drain ran, or None when it did not drain."""
        if not self._broker_reachable():
            if not self.degraded:
                log.warning("broker unreachable: this process claims from PostgreSQL alone")
                self.degraded = True
            return self._drains.run(self._drain, wait=False)
        if self.degraded:
            log.warning("broker reachable again: back to its wake-ups")
            self.degraded = False
        if self._idle_poll and self._drains.idle_for() >= self._idle_poll:
            return self._drains.run(self._drain, wait=False)
        return None
