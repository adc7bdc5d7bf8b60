"""The ends of an attempt other than a completion: a failure, a cancel acknowledged, a lease
given back, each written through the store at once, and every end (completions too) counted
and logged once (:meth:`Ends.end`); and the give-back of jobs held behind a long one, which
never started here (:meth:`Ends.hand_over`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from uuid import UUID

from spacejobs.models.diagnostics import diagnose
from spacejobs.models.errors import WaitRequested
from spacejobs.models.jobs.records import LeasedJob, Status
from spacejobs.tasks.engine.leases import Failure
from spacejobs.tasks.engine.ports import Ports, Signals
from spacejobs.tasks.engine.tracing import NO_SPANS, NoSpans

log = logging.getLogger("spacejobs.runner")


class Outcome(StrEnum):
    """How one attempt ended, for logs, worker counts and tests."""

    COMPLETED = "completed"
    RETRY = "retry"  # back in the queue, same job, same id
    FAILED = "failed"
    CANCELLED = "cancelled"
    RELEASED = "released"  # given back at shutdown, attempt not counted
    LEASE_LOST = "lease_lost"  # a newer attempt owns the job: nothing of ours was written
    STALE_FINISH = "stale_finish_discarded"  # ran to the end, but the lease had moved on
    CRASHED = "crashed"  # not even the failure could be recorded (database gone): lease expires
    WAITING = "waiting"  # the kind waits: lease and slot given back, the attempt not used up
    RESUMED = "resumed"  # it asked to wait for what had already come: queued again at once


#: the ends that are not the worker's failures (every other one counts in ``Stats.failed``)
NOT_FAILURES = frozenset({Outcome.COMPLETED, Outcome.CANCELLED, Outcome.RELEASED,
                          Outcome.WAITING, Outcome.RESUMED})

#: what a recorded failure made of the job (the store's answer), as an outcome; no answer
#: (None) means a newer attempt held the lease and nothing was written
AFTER_FAILURE: Mapping[Status | None, Outcome] = {
    Status.QUEUED: Outcome.RETRY,
    Status.FAILED: Outcome.FAILED,
    Status.CANCELLED: Outcome.CANCELLED,
    None: Outcome.LEASE_LOST,
}


class Stats:
    """This process's counts (worker presence shows them); one job runs at a time per process."""

    def __init__(self) -> None:
        self.running = 0
        self.processed = 0
        self.failed = 0


class Ends:
    def __init__(self, ports: Ports, signals: Signals, stats: Stats,
                 spans: NoSpans = NO_SPANS) -> None:
        self.ports = ports
        self.signals = signals
        self.stats = stats
        self.spans = spans

    def end(self, job: LeasedJob, outcome: Outcome, seconds: float = 0.0) -> None:
        """The attempt is over: its lease is no longer this process's to keep."""
        self.ports.keeper.drop([job.id])
        self.stats.processed += 1
        failure = outcome not in NOT_FAILURES
        if failure:
            self.stats.failed += 1
        self.spans.end(job, outcome, failure=failure)
        log.info("job attempt ended: %s in %.3fs", outcome, seconds, extra=job.log_context)

    def fail(self, job: LeasedJob, failure: Failure) -> Outcome:
        context = job.log_context
        self.spans.note(job, {"spacejobs.error.code": failure.error.code})
        try:
            status = self.ports.leases.fail(job, failure)
        except Exception:
            log.exception("could not record a failed attempt; its lease will expire", extra=context)
            return Outcome.CRASHED
        outcome = AFTER_FAILURE.get(status, Outcome.FAILED)
        if outcome is Outcome.LEASE_LOST:
            log.warning("failure of a stale attempt discarded", extra=context)
            return outcome
        log.info("job attempt failed with %s; now %s", failure.error.code, status, extra=context)
        if outcome is Outcome.RETRY:
            self.signals.publish_wake(str(job.id), countdown=failure.retry_in)
        return outcome

    def acknowledge_cancel(self, job: LeasedJob) -> Outcome:
        if self.ports.leases.acknowledge_cancel(job):
            log.info("job cancelled at a safe point", extra=job.log_context)
            return Outcome.CANCELLED
        return Outcome.LEASE_LOST

    def give_back(self, jobs: list[LeasedJob]) -> Outcome:
        """Release leases without counting the attempt (shutdown); another worker is woken."""
        try:
            released = self.ports.leases.release(jobs)
        finally:
            self.ports.keeper.drop([j.id for j in jobs])
        for job in jobs:
            log.info("job given back at shutdown; attempt not counted", extra=job.log_context)
        if released:
            self.signals.publish_wake(None)
        return Outcome.RELEASED if released else Outcome.LEASE_LOST

    def hand_over(self, jobs: list[LeasedJob]) -> set[UUID]:
        """Give back leased jobs this process has not started while it runs a long one, and
        wake another process to take them; returns the ids given back. What is not given back
        (a cancel asked for, a lease lost; all of them if the database did not answer) stays
        this process's to end in turn."""
        try:
            released = self.ports.leases.release(jobs)
        except Exception as exc:
            log.warning("held jobs not given back (%s); they run here in turn",
                        diagnose(exc).summary)
            return set()
        given = [job for job in jobs if job.id in released]
        self.ports.keeper.drop([job.id for job in given])
        self.spans.forget(given)
        for job in given:
            log.info("job given back unstarted: its process runs a long job; attempt not"
                     " counted", extra=job.log_context)
        if given:
            # Coalesced: a wake-up already on its way finds these jobs too. A process that
            # lingers on LISTEN hears the release's NOTIFY instead (store.release_batch).
            self.signals.fan_out()
        return released

    def wait(self, job: LeasedJob, request: WaitRequested) -> Outcome:
        """End the run to wait; a cancel asked for meanwhile is acknowledged instead."""
        until = request.until if isinstance(request.until, datetime) else None
        status = self.ports.leases.wait(job, until, request.signal, request.children)
        if status is None:
            return self.acknowledge_cancel(job)  # cancel_requested, or the lease is gone
        if status == Status.QUEUED:
            self.signals.publish_wake(str(job.id))
            return Outcome.RESUMED
        waits_for = _what(request)
        log.info("job waits for %s", waits_for, extra=job.log_context)
        self.spans.event(job, "spacejobs.wait", {"spacejobs.wait.for": waits_for})
        return Outcome.WAITING

    def lease_lost(self, job: LeasedJob) -> Outcome:
        log.warning("job stopped: lease lost to a newer attempt", extra=job.log_context)
        return Outcome.LEASE_LOST


def _what(request: WaitRequested) -> str:
    """What a wait is for, as its log line and span event say it: a word of ours, never the
    signal's name (the kind's own words)."""
    if request.children is not None:
        return "children"
    if request.signal is not None:
        return "signal"
    return "moment"
