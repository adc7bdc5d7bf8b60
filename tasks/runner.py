"""The job runner: lease a batch → run each job in tenant-scoped transactions → fenced finish.

Every decision about a job's state is made by the store (through :class:`WorkerLeases`); this
module sequences it:

- **Leases come in batches.** A claim leases up to K due jobs in one statement, each with its
  own token. K adapts to how long recent jobs took (:class:`BatchSize`): many when jobs are
  short, so a batch costs one commit, one when they are long, so no job waits in this process's
  hands while another process idles.
- **Finishes are buffered and folded into the next claim.** A finished job's result waits in
  ``pending`` and is committed, fenced per row and with the requesters' standing re-checked for
  the whole batch in one query, in the same transaction that leases the next batch (or alone,
  before the process goes idle, after ``FLUSH_AFTER`` seconds, before a job with a hard time
  limit starts, and at shutdown). A process killed with results still pending loses no job: the
  leases expire and the jobs run again (at least once, as before batching).
- **One heartbeat per process** (:class:`~tasks.heartbeat.LeaseKeeper`) keeps every held lease
  alive in one statement per tick.
- **What an exception means** is the small table :data:`ON_EXCEPTION`.
- **Large results are files written before the finish** (models.results.attempt): a finish
  that is stale or refused deletes its file once the report says so; an attempt that raised
  deletes its files at once.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol
from uuid import UUID

from models.diagnostics import diagnose
from models.errors import (
    CancelRequested,
    DomainError,
    InternalJobError,
    LeaseLost,
    ReleaseRequested,
    UnknownKind,
)
from models.jobs.context import JobContext, JobRuntime, LeaseFlags
from models.jobs.leases import Failure, Finished, FinishReport
from models.jobs.records import LeasedJob, Status
from models.kinds import JobKind, get_any_kind
from models.ops import counters
from models.results.attempt import DEFAULT_INLINE_MAX_BYTES, AttemptResults, delete_quietly
from models.results.store import ResultStore

log = logging.getLogger("spacejobs.runner")

#: a completed job's result may wait this long for the next claim before it is flushed alone
FLUSH_AFTER = 0.005
#: pauses before claiming again when a claim found only jobs other claims had locked
CONTENDED_RETRIES = (0.005, 0.02, 0.05)


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


class Action(StrEnum):
    NOTHING = "nothing"
    RELEASE = "release"
    ACKNOWLEDGE_CANCEL = "acknowledge_cancel"
    FAIL = "fail"


#: What an exception out of a job means, first match wins. A domain error is the kind's own
#: safe message; anything else is an internal error whose detail goes to operators only.
ON_EXCEPTION: tuple[tuple[type[BaseException], Action], ...] = (
    (LeaseLost, Action.NOTHING),
    (ReleaseRequested, Action.RELEASE),
    (CancelRequested, Action.ACKNOWLEDGE_CANCEL),
    (DomainError, Action.FAIL),
    (Exception, Action.FAIL),
)


def action_for(exc: BaseException) -> Action:
    return next(action for kind, action in ON_EXCEPTION if isinstance(exc, kind))


class Leases(JobRuntime, Protocol):
    """What the runner needs of the store (models.jobs.leases.WorkerLeases, or a fake)."""

    def finish_and_claim(self, finished: Sequence[Finished], *, claim: int,
                         controls: list[Any] | None = None,
                         after_organization: UUID = ...) -> FinishReport: ...

    def fail(self, job: LeasedJob, failure: Failure) -> Status | None: ...

    def acknowledge_cancel(self, job: LeasedJob) -> bool: ...

    def release(self, jobs: Sequence[LeasedJob]) -> set[UUID]: ...


class Keeper(Protocol):
    """The process's heartbeat (tasks.heartbeat.LeaseKeeper)."""

    def hold(self, jobs: Sequence[LeasedJob]) -> None: ...

    def drop(self, job_ids: Sequence[UUID]) -> None: ...

    def flags(self, job_id: UUID) -> LeaseFlags: ...

    def running(self, job: LeasedJob, rules: Any, started: float) -> None: ...

    def idle(self) -> None: ...


class Stats:
    """This process's counts (worker presence shows them); one job runs at a time per process."""

    def __init__(self) -> None:
        self.running = 0
        self.processed = 0
        self.failed = 0


class Ring:
    """Where this process's next claim starts its turn among the organizations (kept across
    wake-ups, so every organization with due work gets served in turn)."""

    def __init__(self) -> None:
        self.after = UUID(int=0)


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
class Runner:
    """Drains the queue for one Celery task: lease, run, finish, until there is nothing due."""

    leases: Leases
    keeper: Keeper
    stats: Stats
    batch: BatchSize
    controls: Callable[[], list[Any]]
    publish_wake: Callable[..., object]
    stop_requested: Callable[[], bool]
    release_due: Callable[[], bool]
    count: Callable[[str, str], None] = lambda name, kind: None
    clock: Callable[[], float] = time.monotonic
    #: after the queue runs dry, wait this long for new work (a NOTIFY) before giving the pool
    #: process back to Celery: a job submitted meanwhile starts within a round trip instead of
    #: after a trip through the broker
    linger: float = 0.0
    wait_for_work: Callable[[float], bool] = lambda seconds: False
    #: tell another process there is work (a coalesced wake-up), once per drain that finds more
    fan_out: Callable[[], object] = lambda: None
    ring: Ring = field(default_factory=Ring)
    #: where large results go (None: every result stays inline, and storing a file fails)
    results: ResultStore | None = None
    inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES

    def drain(self, limit: int) -> int:
        """Drain, then linger for new work and drain again, until the linger passes idle, the
        limit is reached or the worker is stopping; returns how many attempts ran."""
        ran = self.drain_once(limit)
        while (self.linger > 0 and ran < limit and not self.stop_requested()
               and self.wait_for_work(self.linger)):
            ran += self.drain_once(limit - ran)
        return ran

    def drain_once(self, limit: int) -> int:
        """Run due jobs until none is left, at most ``limit``; returns how many attempts ran.

        When it stops at the limit (its last claim was full, so more is likely due), it publishes
        a wake-up so the queue goes on draining: wake-ups are coalesced, and nobody else may
        send one."""
        self._pending: list[Finished] = []
        self._pending_since = 0.0
        held: deque[LeasedJob] = deque()
        ran = 0
        fanned_out = False
        try:
            while True:
                if not held:
                    want = 0 if self.stop_requested() or ran >= limit else self.batch.next(limit - ran)
                    if not self._pending and not want:
                        break
                    held.extend(self._flush(claim=want))
                    for pause in CONTENDED_RETRIES:
                        if held or not self._more_due or self.stop_requested():
                            break
                        # Jobs were due but locked by concurrent claims for a moment: look
                        # again shortly rather than go idle while they wait.
                        time.sleep(pause)
                        held.extend(self._flush(claim=want))
                    if not held:
                        break
                    if self._more_due and not fanned_out:
                        # More is due than we took. Wake-ups are coalesced, so the other idle
                        # processes hear of it only from us.
                        self.fan_out()
                        fanned_out = True
                if self.stop_requested():
                    break  # the held jobs are given back below, unstarted
                job = held.popleft()
                kind = _kind(job)
                if self._pending and (self.clock() - self._pending_since > FLUSH_AFTER
                                      or (kind is not None and kind.rules.hard_time_limit)):
                    # A long job must not hold finished results hostage, and a job the heartbeat
                    # may kill must not take them down with it.
                    self._flush(claim=0)
                started = self.clock()
                finished = self.run_one(job, kind)
                self.batch.observe(self.clock() - started)
                ran += 1
                if finished is not None:
                    if not self._pending:
                        self._pending_since = self.clock()
                    self._pending.append(finished)
        finally:
            if self._pending:
                self._flush(claim=0)
            if held:
                self._give_back(list(held))
        if ran >= limit and not self.stop_requested():
            self.publish_wake(None)
        return ran

    def run_one(self, job: LeasedJob, kind: JobKind | None) -> Finished | None:
        """Run one leased job. A job that returned is handed back for the batched finish; every
        other end of the attempt is recorded here and now."""
        context = job.log_context
        if kind is None:
            # A worker without this kind's code (e.g. mid-deploy) fails it and says so.
            self._end(job, self._fail(job, Failure(UnknownKind()), context))
            return None
        flags = self.keeper.flags(job.id)
        if flags.cancel.is_set():
            self._end(job, self._acknowledge_cancel(job, context))
            return None
        started = self.clock()
        rules = kind.rules
        results = AttemptResults(self.results, job, inline_max_bytes=self.inline_max_bytes)
        ctx = JobContext(self.leases, job, rules, flags=flags,
                         deadline=started + rules.time_limit if rules.time_limit else None,
                         should_release=self.release_due, results=results)
        self.keeper.running(job, rules, started)
        self.stats.running = 1
        try:
            result, ref = results.settle(kind.run(ctx, kind.parse_params(job.params)))
        except Exception as exc:
            results.discard()  # no finish will reference them
            outcome = self._after_exception(job, rules, exc, context)
            self._end(job, outcome, self.clock() - started)
            return None
        finally:
            self.keeper.idle()
            self.stats.running = 0
        return Finished(job, rules, result, self.clock() - started, result_ref=ref)

    # -- the ends of an attempt ------------------------------------------------------------
    def _after_exception(self, job: LeasedJob, rules: Any, exc: Exception,
                         context: dict[str, Any]) -> Outcome:
        action = action_for(exc)
        if action is Action.NOTHING:
            log.warning("job stopped: lease lost to a newer attempt", extra=context)
            return Outcome.LEASE_LOST
        if action is Action.RELEASE:
            return self._give_back([job])
        if action is Action.ACKNOWLEDGE_CANCEL:
            return self._acknowledge_cancel(job, context)
        if isinstance(exc, DomainError):
            failure = Failure(exc, retry_in=rules.backoff(job.attempt))
        else:
            failure = Failure(InternalJobError(), retry_in=rules.backoff(job.attempt),
                              diagnosis=diagnose(exc))
        return self._fail(job, failure, context)

    def _fail(self, job: LeasedJob, failure: Failure, context: dict[str, Any]) -> Outcome:
        try:
            status = self.leases.fail(job, failure)
        except Exception:
            log.exception("could not record a failed attempt; its lease will expire", extra=context)
            return Outcome.CRASHED
        if status is None:
            log.warning("failure of a stale attempt discarded", extra=context)
            return Outcome.LEASE_LOST
        log.info("job attempt failed with %s; now %s", failure.error.code, status, extra=context)
        if status == Status.QUEUED:
            self.publish_wake(str(job.id), countdown=failure.retry_in)
            return Outcome.RETRY
        return Outcome.CANCELLED if status == Status.CANCELLED else Outcome.FAILED

    def _acknowledge_cancel(self, job: LeasedJob, context: dict[str, Any]) -> Outcome:
        if self.leases.acknowledge_cancel(job):
            log.info("job cancelled at a safe point", extra=context)
            return Outcome.CANCELLED
        return Outcome.LEASE_LOST

    def _give_back(self, jobs: list[LeasedJob]) -> Outcome:
        try:
            released = self.leases.release(jobs)
        finally:
            self.keeper.drop([j.id for j in jobs])
        for job in jobs:
            log.info("job given back at shutdown; attempt not counted", extra=job.log_context)
        if released:
            self.publish_wake(None)
        return Outcome.RELEASED if released else Outcome.LEASE_LOST

    def _flush(self, *, claim: int) -> list[LeasedJob]:
        """Commit the pending finishes and lease up to ``claim`` more, in one transaction."""
        pending, self._pending = self._pending, []
        try:
            report = self.leases.finish_and_claim(pending, claim=claim,
                                                  controls=self.controls() if claim else None,
                                                  after_organization=self.ring.after)
        except Exception:
            # The results stay uncommitted: their leases expire and the jobs run again. Their
            # files stay too: the commit may have happened before the connection broke, and
            # only the orphan sweep, which asks the rows, can tell.
            for item in pending:
                self._end(item.job, Outcome.CRASHED, item.seconds)
            raise
        seconds = {f.job.id: f.seconds for f in pending}
        refs = {f.job.id: f.result_ref for f in pending if f.result_ref}
        for job in [*report.stale, *(job for job, _refusal in report.refused)]:
            if job.id in refs:  # not recorded: nothing will ever serve its file
                delete_quietly(self.results, refs[job.id], job.log_context)
        for job in report.completed:
            self._end(job, Outcome.COMPLETED, seconds[job.id])
        for job, refusal in report.refused:
            log.info("job refused at its finish: %s", refusal.code, extra=job.log_context)
            self._end(job, Outcome.FAILED, seconds[job.id])
        for job in report.stale:
            self.count(counters.STALE_FINISHES, job.kind)
            log.warning("stale finish discarded: a newer attempt owns the job",
                        extra=job.log_context)
            self._end(job, Outcome.STALE_FINISH, seconds[job.id])
        self.keeper.hold(report.leased)
        self._more_due = report.more_due
        if claim:
            self.ring.after = report.next_organization
        return report.leased

    def _end(self, job: LeasedJob, outcome: Outcome, seconds: float = 0.0) -> None:
        self.keeper.drop([job.id])
        self.stats.processed += 1
        if outcome not in (Outcome.COMPLETED, Outcome.CANCELLED, Outcome.RELEASED):
            self.stats.failed += 1
        log.info("job attempt ended: %s in %.3fs", outcome, seconds, extra=job.log_context)


def _kind(job: LeasedJob) -> JobKind | None:
    try:
        return get_any_kind(job.kind)  # a leased row of a child-only kind runs too
    except UnknownKind:
        return None
