"""Beat's schedule of the chores: when each is due, running the due ones in order, and what
beat logs about them.

Each chore runs on its own cadence: the first run at beat's start (what came due while no beat
ran is handled at once), each next one ``interval`` seconds after the tick it ran in ENDED, so
a run that takes long (a connect timeout) is never followed by another at once, and chores of
one cadence that ran in one tick stay together in the next (one line, not one a chore). The
chores run one after another in beat's own loop: a slow one delays the others, never overlaps
them, and the chores due at one tick run in the order of the list
(tasks/maintenance/__init__.py).

A chore that raises is logged, and retried at its next run; the others run as if nothing
happened. While it keeps failing (PostgreSQL down, a restart) it is logged once with its
traceback, then once a minute, and once when it works again: not a traceback per run for as
long as the outage lasts.

Beat logs one line per tick in which a chore that is not ``frequent`` ran: what each chore of
that tick did, and what the frequent ones (the timers, several times a second) did since the
line before. A tick whose chores left wake-ups unpublished (the broker is down) adds a warning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from spacejobs.tasks.maintenance.chore import Chore, Report
from spacejobs.tasks.worker_process import WorkerProcess

log = logging.getLogger("spacejobs.maintenance")

#: while something keeps failing, at most one log line per this many seconds (not four
#: tracebacks a second for as long as PostgreSQL is down)
FAILURE_LOG_EVERY = 60.0


class Outage:
    """The log lines of one thing that fails run after run: the first failure with its
    traceback, then a line a minute while it lasts, then one when it works again.

    ``what`` names it in the lines (``chore timers``, ``periodic job nightly``); ``failed`` says
    what happened to it (``failed``, ``not submitted``)."""

    def __init__(self, what: str, interval: float, *, failed: str = "failed",
                 clock: Callable[[], float] = time.monotonic,
                 logger: logging.Logger = log) -> None:
        self.what = what
        self.interval = interval
        self._failed_word = failed
        self._clock = clock
        self._log = logger
        self._since: float | None = None
        self._failures = 0
        self._last_line = 0.0

    def failed(self) -> None:
        """Called from the ``except`` block of the failure (the first line logs its traceback)."""
        now = self._clock()
        self._failures += 1
        if self._since is None:
            self._since = self._last_line = now
            self._log.exception("%s %s; trying again every %gs", self.what, self._failed_word,
                                self.interval)
        elif now - self._last_line >= FAILURE_LOG_EVERY:
            self._last_line = now
            self._log.warning("%s: still failing (%d tries in %.0fs)", self.what,
                              self._failures, now - self._since)

    def succeeded(self) -> None:
        if self._since is not None:
            self._log.info("%s works again after %d failed tries in %.0fs", self.what,
                           self._failures, self._clock() - self._since)
        self._since = None
        self._failures = 0


class Slot:
    """One chore in beat's schedule: when it is next due, its outage, and (a frequent chore)
    what its runs did since beat's last line."""

    def __init__(self, chore: Chore, clock: Callable[[], float]) -> None:
        self.chore = chore
        self._clock = clock
        self.next = clock()  # the first run at once
        self.outage = Outage(f"chore {chore.name}", chore.interval, clock=clock)
        self.runs = 0
        self.totals: Report | None = None

    def seconds_left(self) -> float:
        return max(0.0, self.next - self._clock())

    def run(self, process: Callable[[], WorkerProcess]) -> Report | None:
        """Run the chore once; None when it failed (logged). Never raises an Exception. The
        caller says when it is next due (:meth:`Maintenance.run_due`)."""
        try:
            report = self.chore.run(process())
        except Exception:
            self.outage.failed()
            return None
        self.outage.succeeded()
        return report

    def take_totals(self) -> tuple[int, Report | None]:
        """A frequent chore's runs and their counts since the last call; counting starts again."""
        found = (self.runs, self.totals)
        self.runs, self.totals = 0, None
        return found

    def count(self, report: Report) -> None:
        self.runs += 1
        if self.totals is None:
            self.totals = type(report)()
        self.totals.add(report)


class Maintenance:
    """The chores of one beat, each on its own cadence."""

    def __init__(self, chores: Sequence[Chore], process: Callable[[], WorkerProcess], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._process = process
        self._clock = clock
        self.slots = [Slot(chore, clock) for chore in chores]

    def seconds_left(self) -> float:
        """Until the next chore is due (0: now); what beat may sleep."""
        return min((slot.seconds_left() for slot in self.slots), default=60.0)

    def run_due(self) -> dict[str, Report]:
        """Run every chore that is due, in order; what each that succeeded did. Never raises
        an Exception: a failing chore is logged, and the others run."""
        started = self._clock()
        due = [slot for slot in self.slots if slot.seconds_left() == 0]
        ran: dict[str, Report] = {}
        logged: dict[str, Report] = {}
        for slot in due:
            report = slot.run(self._process)
            if report is None:
                continue
            ran[slot.chore.name] = report
            if slot.chore.frequent:
                slot.count(report)
            else:
                logged[slot.chore.name] = report
        ended = self._clock()
        for slot in due:  # run or failed alike
            slot.next = ended + slot.chore.interval
        if logged:
            self._log_line(logged, ended - started)
        return ran

    def _log_line(self, logged: dict[str, Report], seconds: float) -> None:
        done = "; ".join(f"{name} {report.as_dict()}" for name, report in logged.items())
        since = []
        for slot in self.slots:
            if slot.chore.frequent:
                runs, totals = slot.take_totals()
                since.append(f"{slot.chore.name} {runs} runs"
                             + (f" {totals.as_dict()}" if totals is not None else ""))
        log.info("maintenance ran in %.3fs: %s%s", seconds, done,
                 "; since the last line: " + ", ".join(since) if since else "")
        deferred = sum(getattr(report, "publish_failures", 0) for report in logged.values())
        if deferred:
            log.warning("maintenance: broker unreachable, wake-ups for %d jobs deferred (the "
                        "resignal chore re-sends them)", deferred)
