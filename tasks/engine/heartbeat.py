"""One heartbeat per worker process: it keeps every lease the process holds alive.

A process holds leases from the moment it claims a batch until the batch's finishes are
committed: jobs running, jobs leased but not started yet, and jobs finished but not flushed.
One thread extends all of them with ONE statement per tick (every third of the shortest lease
held), instead of a thread and a statement per job. A lease missing from the answer was lost to
a newer attempt; a lease whose job is ``cancel_requested`` is told so. Both are flags the job
reads at its next checkpoint, and its writes and finish are fenced by the token in any case.

A cancel should not wait for the next extension (seconds away with a long lease): while a job
has been running for longer than ``cancel_check`` seconds, the thread also reads, that often,
whether it was asked to cancel (a read of one row; a drain of jobs shorter than that never
pays for it).

Past a running job's hard time limit it records ``timed_out`` (fenced) and kills the process:
a job that never reaches a checkpoint cannot be stopped any other way, and Celery replaces the
pool process. The leases of the other held jobs then expire and the jobs run again elsewhere.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from uuid import UUID

from spacejobs.models.diagnostics import diagnose
from spacejobs.models.errors import TimedOut
from spacejobs.models.jobs.records import LeasedJob, Status
from spacejobs.models.kinds.rules import KindRules
from spacejobs.tasks.engine.context import LeaseFlags
from spacejobs.tasks.engine.leases import Failure

log = logging.getLogger("spacejobs.heartbeat")

Extend = Callable[[list[tuple[UUID, UUID]]], dict[UUID, Status]]
Fail = Callable[[LeasedJob, Failure], object]
#: which of these jobs were asked to cancel
CancelsAsked = Callable[[list[UUID]], set[UUID]]


@dataclass
class _Held:
    job: LeasedJob
    flags: LeaseFlags


@dataclass
class _Running:
    job: LeasedJob
    rules: KindRules
    kill_at: float


class LeaseKeeper:
    def __init__(self, extend: Extend, fail: Fail, *, cancels_asked: CancelsAsked | None = None,
                 cancel_check: float = 0.5, kill: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._extend = extend
        self._fail = fail
        self._cancels_asked = cancels_asked
        self._cancel_check = cancel_check
        self._kill = kill or (lambda: os.kill(os.getpid(), signal.SIGKILL))
        self._clock = clock
        self._held: dict[UUID, _Held] = {}
        self._running: _Running | None = None
        #: the job running now, and when its next look for a cancel is due
        self._current: LeasedJob | None = None
        self._cancel_due = math.inf
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_tick = clock()

    # -- what the runner tells it ----------------------------------------------------------
    def hold(self, jobs: Iterable[LeasedJob]) -> None:
        with self._lock:
            if not self._held:
                self._last_tick = self._clock()  # fresh leases: the next tick is a third away
            for job in jobs:
                self._held[job.id] = _Held(job, LeaseFlags())
            if self._held and self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="lease-heartbeat",
                                                daemon=True)
                self._thread.start()
        self._wake.set()  # a shorter lease may bring the next tick forward

    def drop(self, job_ids: Iterable[UUID]) -> None:
        with self._lock:
            for job_id in job_ids:
                self._held.pop(job_id, None)

    def flags(self, job_id: UUID) -> LeaseFlags:
        with self._lock:
            held = self._held.get(job_id)
        return held.flags if held else LeaseFlags()

    def running(self, job: LeasedJob, rules: KindRules, started: float) -> None:
        """The job now running, for its hard time limit (None: no job running)."""
        with self._lock:
            self._running = (_Running(job, rules, started + rules.hard_time_limit)
                             if rules.hard_time_limit else None)
            self._current = job
            if self._cancels_asked is not None:
                self._cancel_due = self._clock() + self._cancel_check
        self._wake.set()

    def idle(self) -> None:
        with self._lock:
            self._running = None
            self._current = None
            self._cancel_due = math.inf

    @property
    def held(self) -> int:
        return len(self._held)

    # -- the thread ------------------------------------------------------------------------
    def interval(self) -> float:
        """A third of the shortest lease held (at least 0.2 s); 1 s when none is held."""
        with self._lock:
            shortest = min((h.job.lease_seconds for h in self._held.values()), default=3)
        return max(0.2, shortest / 3)

    def tick(self) -> None:
        """Extend every held lease once, note what was lost or asked to cancel, enforce the
        running job's hard time limit. Runs in the thread; public for the unit tests."""
        with self._lock:
            held = list(self._held.values())
            overdue = self._running
            if overdue is not None and self._clock() > overdue.kill_at:
                # Taken under the lock, so two ticks at once (the thread's and a caller's)
                # record the timeout and kill once, not twice.
                self._running = None
            else:
                overdue = None
        if overdue is not None:
            self._hard_kill(overdue)
        if not held:
            return
        try:
            answer = self._extend([(h.job.id, h.job.lease_token) for h in held])
        except Exception as exc:
            # What failed, never its message (models/diagnostics.py).
            log.warning("lease heartbeat failed (%s); will retry", diagnose(exc).summary)
            return
        for item in held:
            item.flags.note(answer.get(item.job.id))

    def check_cancel(self) -> None:
        """Whether the running job was asked to cancel, noted in its flags. Runs in the thread;
        public for the unit tests."""
        with self._lock:
            current = self._current
            held = self._held.get(current.id) if current is not None else None
            self._cancel_due = self._clock() + self._cancel_check if current else math.inf
        if current is None or held is None or self._cancels_asked is None:
            return
        try:
            asked = self._cancels_asked([current.id])
        except Exception as exc:
            log.warning("cancel check failed (%s); will retry", diagnose(exc).summary)
            return
        if current.id in asked:
            held.flags.note(Status.CANCEL_REQUESTED)

    def _next_tick(self) -> float:
        due = self._last_tick + self.interval()
        with self._lock:
            if self._running is not None:
                due = min(due, self._running.kill_at)
        return due

    def _loop(self) -> None:
        while True:
            # Woken early by hold() and running(), only to work out the next tick again.
            self._wake.wait(max(0.0, min(self._next_tick(), self._cancel_due) - self._clock()))
            self._wake.clear()
            if self._clock() >= self._next_tick():
                self._last_tick = self._clock()
                self.tick()
            elif self._clock() >= self._cancel_due:
                self.check_cancel()

    def _hard_kill(self, running: _Running) -> None:
        job = running.job
        log.error("job exceeded its hard time limit; killing its worker process",
                  extra=job.log_context)
        try:
            error = TimedOut(permanent=not running.rules.retry_on_timeout)
            self._fail(job, Failure(error, retry_in=running.rules.backoff(job.attempt)))
        finally:
            # If that write failed, the lease simply expires and the sweeper applies the rules.
            self._kill()
