"""Beat's short cadence for durable timers (``SPACEJOBS_TIMER_INTERVAL``).

A job that sleeps (``ctx.sleep``, ``sleep_until``, a signal's timeout) waits without a worker,
and goes back to the queue when something finds its moment has passed. The full sweep does
that among much else (expired leases, re-signals, purges, retention, the orphan sweep), every
``SPACEJOBS_SWEEP_INTERVAL``: too rarely for a timer, and too much to run more often. So between
sweeps beat runs only the timers' statement, ``resume_due_timers()`` (one range of an index:
its cost follows the timers that are due), several times a second.

The rounds run in beat's own loop, like the sweeps: one thing at a time, so a sweep delays a
round by its own duration and never overlaps one. Several beats may each run them: FOR UPDATE
SKIP LOCKED gives each due job to one beat. A failed round (PostgreSQL down, a restart) is
logged and the next one tries again; the sweep's resume_due_waits() is the floor under them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from spacejobs.tasks.sweeper import TimersReport

log = logging.getLogger("spacejobs.beat")

#: while rounds keep failing, at most one log line per this many seconds (not four tracebacks
#: a second for as long as PostgreSQL is down)
FAILURE_LOG_EVERY = 60.0


class TimerRounds:
    """When beat's next round of due timers is, and what the rounds did since the last sweep."""

    def __init__(self, interval: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._next = clock()  # the first round at once: timers that came due while beat was down
        self._failing_since: float | None = None
        self._failed_rounds = 0
        self._last_failure_log = 0.0
        self.rounds = 0
        #: what the rounds did since :meth:`take_totals` last read it (beat logs it per sweep)
        self.totals = TimersReport()

    def seconds_left(self) -> float:
        """Until the next round is due (0: now)."""
        return max(0.0, self._next - self._clock())

    def run_if_due(self, run: Callable[[], TimersReport]) -> TimersReport | None:
        """Run a round if one is due; never raises (a failure is logged, the next round tries
        again). The next round is due one interval after this one ends, so rounds that take
        long (a connect timeout) never run back to back."""
        if self._clock() < self._next:
            return None
        try:
            report = run()
        except Exception:
            self._failed()
            return None
        finally:
            self._next = self._clock() + self.interval
        self._succeeded()
        self.rounds += 1
        self.totals.resumed += report.resumed
        self.totals.wakeups_sent += report.wakeups_sent
        self.totals.publish_failures += report.publish_failures
        return report

    def take_totals(self) -> tuple[int, TimersReport]:
        """The rounds and their totals since the last call, and start counting again."""
        found = (self.rounds, self.totals)
        self.rounds, self.totals = 0, TimersReport()
        return found

    def _failed(self) -> None:
        now = self._clock()
        self._failed_rounds += 1
        if self._failing_since is None:
            self._failing_since = self._last_failure_log = now
            log.exception("timers: a round of due timers failed; trying again every %gs",
                          self.interval)
        elif now - self._last_failure_log >= FAILURE_LOG_EVERY:
            self._last_failure_log = now
            log.warning("timers: rounds of due timers still failing (%d rounds in %.0fs)",
                        self._failed_rounds, now - self._failing_since)

    def _succeeded(self) -> None:
        if self._failing_since is not None:
            log.info("timers: rounds of due timers work again after %d failed in %.0fs",
                     self._failed_rounds, self._clock() - self._failing_since)
        self._failing_since = None
        self._failed_rounds = 0
