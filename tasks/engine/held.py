"""What a drain holds and has not started, and the watch that gives it back behind a long job.

A claim leases a batch sized from how long recent jobs took (:class:`~tasks.runner.BatchSize`),
which cannot foresee a long job: after a burst of short jobs, a claim that finds a group's two
4 s steps leases both, and the second would wait 4 s in this process's hands while another
process idles. So when the job a drain runs has run :data:`GIVE_BACK_AFTER` seconds while the
drain still holds leased jobs it has not started, they are given back (one fenced statement,
their attempts not counted) and another process is woken to take them at once; the running job
goes on.

One thread per process watches (:class:`LongJobWatch`), armed once per batch of more than one
job, never per job: a drain of short jobs pays an uncontended lock and one float written per
job, and the thread a look every :data:`GIVE_BACK_AFTER` seconds while a batch is held.

One lock (:class:`HeldJobs`) covers the held queue and the give-back, so a held job is either
started by the drain or given back, never both: a drain whose long job ends while the give-back
is on its way waits for it (one statement) and then finds those jobs gone, rather than start a
job whose lease is no longer its own (its finish would be fenced, its work done twice).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from uuid import UUID

from spacejobs.models.diagnostics import diagnose
from spacejobs.models.jobs.records import LeasedJob

log = logging.getLogger("spacejobs.runner")

#: how long the running job may run while jobs wait behind it in its process: four times a
#: whole batch's target (``BatchSize.target``, 50 ms), so a batch of short jobs that runs a
#: little long never gives back, and a held job waits at most this long behind a long one
GIVE_BACK_AFTER = 0.2

#: gives back the jobs it is handed; returns the ids it gave back (tasks.ends.Ends.hand_over)
GiveBack = Callable[[list[LeasedJob]], set[UUID]]


class HeldJobs:
    """A drain's leased jobs not started yet, in claim order, and when the job it runs now
    started: the drain starts them one by one, the watch gives them back."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._waiting: deque[LeasedJob] = deque()
        #: when the job the drain runs now started (on ``clock``), None between jobs; written
        #: by the drain alone, without the lock (one float), read by the watch
        self.running_since: float | None = None

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, jobs: Iterable[LeasedJob]) -> None:
        with self._lock:
            self._waiting.extend(jobs)

    def start_next(self) -> LeasedJob | None:
        """The next held job, now the drain's to run (None when none is held)."""
        with self._lock:
            return self._waiting.popleft() if self._waiting else None

    def take_all(self) -> list[LeasedJob]:
        """Every held job, now the caller's (the drain ends)."""
        with self._lock:
            jobs = list(self._waiting)
            self._waiting.clear()
        return jobs

    def give_back_if_long(self, after: float, give_back: GiveBack) -> float | None:
        """Give the held jobs back if the running job has run ``after`` seconds. Returns the
        seconds until it is worth looking again, or None when there is nothing more to do for
        this batch: nothing held, or a give-back done (what it could not give back, a job asked
        to cancel or one whose lease was lost, stays held for the drain to end)."""
        with self._lock:
            if not self._waiting:
                return None
            since = self.running_since
            if since is None:
                return after  # between two jobs: the drain starts the next one at once
            ran = self._clock() - since
            if ran < after:
                return after - ran
            # Under the lock: the drain cannot start one of these while they are given back.
            given = give_back(list(self._waiting))
            self._waiting = deque(job for job in self._waiting if job.id not in given)
            return None


@dataclass(frozen=True)
class _Watched:
    held: HeldJobs
    give_back: GiveBack


class NoWatch:
    """No watch: a batch's jobs run in turn whatever they take (a runner built without one)."""

    def watch(self, held: HeldJobs, give_back: GiveBack) -> None:
        """Watch ``held`` until it is empty or given back."""


NO_WATCH = NoWatch()


class LongJobWatch(NoWatch):
    """One thread per worker process: gives a drain's held jobs back when the job it runs has
    run ``after`` seconds (see the module's doc)."""

    def __init__(self, *, after: float = GIVE_BACK_AFTER) -> None:
        self.after = after
        self._lock = threading.Lock()
        self._armed = threading.Event()
        self._watched: _Watched | None = None
        self._thread: threading.Thread | None = None

    def watch(self, held: HeldJobs, give_back: GiveBack) -> None:
        """Arm the watch for a batch the drain just claimed (once per batch)."""
        with self._lock:
            self._watched = _Watched(held, give_back)
            self._armed.set()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="long-job-watch",
                                                daemon=True)
                self._thread.start()

    def look(self) -> float | None:
        """One look at the watched batch (see :meth:`HeldJobs.give_back_if_long`); disarms the
        watch when there is nothing more to do for it. Runs in the thread; public for tests."""
        with self._lock:
            watched = self._watched
        if watched is None:
            return None
        try:
            pause = watched.held.give_back_if_long(self.after, watched.give_back)
        except Exception as exc:
            # Never the thread's end: this batch's jobs run in turn, as without the watch.
            log.warning("the long-job watch failed (%s); it watches the next batch",
                        diagnose(exc).summary)
            pause = None
        if pause is None:
            self._disarm(watched)
        return pause

    def _disarm(self, watched: _Watched) -> None:
        with self._lock:
            if self._watched is watched:  # not armed for a newer batch meanwhile
                self._watched = None
                self._armed.clear()

    def _loop(self) -> None:
        while True:
            self._armed.wait()
            pause = self.look()
            if pause is not None:
                time.sleep(pause)
