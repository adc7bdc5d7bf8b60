"""The job runner: lease a batch → run each job in tenant-scoped transactions → fenced finish.

Every decision about a job's state is made by the store (through :class:`~tasks.ports.Leases`);
the runner sequences it, in three parts that each fit in one's head:

- **the loop** (here, :class:`Drain`): lease batches, run the held jobs one by one, linger for
  new work, and stop (giving back what it holds) at shutdown or at the drain's limit;
- **one attempt** (tasks/attempt.py): re-check the leased job, run its kind, and turn how it
  ended into a decision, the table :data:`~tasks.attempt.ON_EXCEPTION`, which
  :class:`~tasks.ends.Ends` writes (failures, cancels, give-backs: at once);
- **the buffer of finished results** (tasks/finishes.py): results of jobs that returned, folded
  into the next claim's transaction, or flushed alone when they would otherwise wait.

Leases come in batches: a claim leases up to K due jobs in one statement, each with its own
token. K adapts to how long recent jobs took (:class:`BatchSize`): many when jobs are short, so
a batch costs one commit, one when they are long, so no job waits in this process's hands while
another process idles. A batch sized for short jobs can still meet a long one: once the job it
runs has run a moment, the jobs it has not started are given back for an idle process
(tasks/held.py). One heartbeat per process (:class:`~tasks.heartbeat.LeaseKeeper`) keeps
every held lease alive in one statement per tick. Large results are files written before the
finish (models.results.attempt): a finish that is stale or refused deletes its file once the
report says so; an attempt that raised deletes its files at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from uuid import UUID

from spacejobs.models.errors import UnknownKind
from spacejobs.models.jobs.records import LeasedJob
from spacejobs.models.kinds import JobKind, get_any_kind
from spacejobs.tasks.engine.attempt import ON_EXCEPTION, Action, Attempt, action_for
from spacejobs.tasks.engine.ends import Ends, Outcome, Stats
from spacejobs.tasks.engine.finishes import FLUSH_AFTER, FinishBuffer
from spacejobs.tasks.engine.held import NO_WATCH, HeldJobs, NoWatch
from spacejobs.tasks.engine.ports import Keeper, Leases, Ports, Signals
from spacejobs.tasks.engine.tracing import NO_SPANS, NoSpans

__all__ = ["FLUSH_AFTER", "ON_EXCEPTION", "Action", "BatchSize", "Drain", "Keeper", "Leases",
           "Outcome", "Ports", "Ring", "Runner", "Signals", "Stats", "Tuning", "action_for"]

#: pauses before claiming again when a claim found only jobs other claims had locked
CONTENDED_RETRIES = (0.005, 0.02, 0.05)


class Ring:
    """Where this process's next claim starts its turn among the organizations (kept across
    wake-ups, so every organization with due work gets served in turn)."""

    def __init__(self) -> None:
        self.after = UUID(int=0)


class WindowAlarm:
    """The wake-up this process asked for at a rate limit's next window: one per window, not
    one per claim that found it full (jobs held back by a limit are due, yet no wake-up is
    coming for them until the window lets one start)."""

    #: the broker's countdown lands a little late rather than early: a claim a moment before
    #: the window opens would find it still full
    MARGIN = 0.05

    def __init__(self) -> None:
        self.set_for: datetime | None = None

    def ring_at(self, opens_at: datetime, publish: Callable[..., object]) -> None:
        now = datetime.now(UTC)
        if self.set_for is not None and now < self.set_for <= opens_at:
            return  # one is set for then or sooner
        self.set_for = opens_at
        publish(None, countdown=max(0.0, (opens_at - now).total_seconds()) + self.MARGIN)


class BatchSize:
    """How many jobs to lease at once: ``target`` seconds of work at the recent average job
    duration, between 1 and ``maximum``. It starts at 1 and at most doubles per claim, so a
    process that meets long jobs first never hoards them."""

    def __init__(self, maximum: int, *, target: float = 0.05) -> None:
        self.maximum = maximum
        self.target = target
        self._average: float | None = None
        self._last = 1

    def next(self, budget: int) -> int:
        if self._average is None:
            size = 1
        else:
            size = min(self._last * 2, int(self.target / max(self._average, 1e-5)))
        self._last = max(1, min(size, self.maximum, budget))
        return self._last

    def observe(self, seconds: float) -> None:
        self._average = seconds if self._average is None else 0.8 * self._average + 0.2 * seconds


@dataclass
class Tuning:
    """How the loop paces itself."""

    batch: BatchSize
    #: after the queue runs dry, wait this long for new work (a NOTIFY) before giving the pool
    #: process back to Celery: a job submitted meanwhile starts within a round trip instead of
    #: after a trip through the broker
    linger: float = 0.0


@dataclass
class Runner:
    """Drains the queue for one Celery task: lease, run, finish, until there is nothing due."""

    ports: Ports
    signals: Signals
    tuning: Tuning
    stats: Stats = field(default_factory=Stats)
    ring: Ring = field(default_factory=Ring)
    window: WindowAlarm = field(default_factory=WindowAlarm)
    clock: Callable[[], float] = time.monotonic
    #: each attempt's span (tasks/tracing.py); nothing at all when tracing is off
    spans: NoSpans = NO_SPANS
    #: the process's watch that gives back what a batch holds behind a long job (tasks/held.py)
    watch: NoWatch = NO_WATCH

    def __post_init__(self) -> None:
        self.ends = Ends(self.ports, self.signals, self.stats, self.spans)
        self.attempt = Attempt(self.ports, self.signals, self.ends, self.stats, clock=self.clock,
                               spans=self.spans)

    def drain(self, limit: int) -> int:
        """Drain, then linger for new work and drain again, until the linger passes idle, the
        limit is reached or the worker is stopping; returns how many attempts ran."""
        ran = self.drain_once(limit)
        while ran < limit and self._new_work_came():
            ran += self.drain_once(limit - ran)
        return ran

    def drain_once(self, limit: int) -> int:
        """Run due jobs until none is left, at most ``limit``; returns how many attempts ran."""
        return Drain(self, limit).run()

    def _new_work_came(self) -> bool:
        linger = self.tuning.linger
        return linger > 0 and not self.signals.stop_requested() and self.signals.wait_for_work(linger)


class Drain:
    """One pass over the queue: claim a batch, run its jobs one by one, claim again, until
    nothing is due, the limit is reached or the worker is stopping."""

    def __init__(self, runner: Runner, limit: int) -> None:
        self.runner = runner
        self.signals = runner.signals
        self.limit = limit
        self.held = HeldJobs(clock=runner.clock)
        self.ran = 0
        self.more_due = False
        self.fanned_out = False
        self.buffer = FinishBuffer(runner.ports, runner.ends, clock=runner.clock)

    def run(self) -> int:
        """When it stops at the limit (more is likely due), it publishes a wake-up so the queue
        goes on draining: wake-ups are coalesced, and nobody else may send one."""
        try:
            while (job := self._next_job()) is not None:
                self._run(job)
        finally:
            self._close()
        if self.ran >= self.limit and not self.signals.stop_requested():
            self.signals.publish_wake(None)
        return self.ran

    def _next_job(self) -> LeasedJob | None:
        """The held job to start now (claiming a batch if none is held); None when the drain
        is over. Once the worker is stopping, the held jobs are given back unstarted."""
        while not self.signals.stop_requested():
            job = self.held.start_next()
            if job is not None:
                return job
            if not self._refill():
                return None
        return None

    def _refill(self) -> bool:
        want = self._wanted()
        if not self.buffer and not want:
            return False
        self._claim(want)
        for pause in CONTENDED_RETRIES:
            if self.held or not self.more_due or self.signals.stop_requested():
                break
            # Jobs were due but locked by concurrent claims for a moment: look again shortly
            # rather than go idle while they wait.
            time.sleep(pause)
            self._claim(want)
        if self.held and self.more_due and not self.fanned_out:
            # More is due than we took. Wake-ups are coalesced, so the other idle processes
            # hear of it only from us.
            self.signals.fan_out()
            self.fanned_out = True
        return bool(self.held)

    def _wanted(self) -> int:
        if self.signals.stop_requested() or self.ran >= self.limit:
            return 0
        return self.runner.tuning.batch.next(self.limit - self.ran)

    def _claim(self, want: int) -> None:
        """Flush the buffer and lease up to ``want`` jobs, in one transaction."""
        ports, ring = self.runner.ports, self.runner.ring
        report = self.buffer.flush(claim=want, controls=ports.controls() if want else None,
                                   after_organization=ring.after)
        ports.keeper.hold(report.leased)
        self.runner.spans.claimed(report.leased)
        self.more_due = report.more_due
        if report.window_opens_at is not None:
            self.runner.window.ring_at(report.window_opens_at, self.signals.publish_wake)
        if want:
            ring.after = report.next_organization
        self.held.add(report.leased)
        if len(report.leased) > 1:
            # Once per batch: only a batch of several jobs can hold one behind a long one.
            self.runner.watch.watch(self.held, self.runner.ends.hand_over)

    def _run(self, job: LeasedJob) -> None:
        kind = _kind(job)
        if self.buffer.due_before(kind):
            self.buffer.flush()
        clock = self.runner.clock
        started = clock()
        self.held.running_since = started
        try:
            finished = self.runner.attempt.run(job, kind)
        finally:
            self.held.running_since = None
        self.runner.tuning.batch.observe(clock() - started)
        self.ran += 1
        if finished is not None:
            self.buffer.add(finished)

    def _close(self) -> None:
        if self.buffer:
            self.buffer.flush()
        unstarted = self.held.take_all()
        if unstarted:
            self.runner.ends.give_back(unstarted)


def _kind(job: LeasedJob) -> JobKind | None:
    try:
        return get_any_kind(job.kind)  # a leased row of a child-only kind runs too
    except UnknownKind:
        return None
