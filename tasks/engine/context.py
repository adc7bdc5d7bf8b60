"""What a running job sees: its leased row, tenant-scoped transactions, progress, checkpoints.

A kind's function receives a :class:`JobContext`. Everything it may act on comes from the
leased ROW (never from the broker's message), and everything it writes is fenced by the lease.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import IO, TYPE_CHECKING, Any, Protocol
from uuid import UUID

from sqlalchemy import Connection

from spacejobs.models import tracing
from spacejobs.models.errors import (
    CancelRequested,
    LeaseLost,
    ReleaseRequested,
    SignalTimeout,
    TimedOut,
    WaitRequested,
)
from spacejobs.models.jobs import canvas as canvases
from spacejobs.models.jobs.records import LeasedJob, Status
from spacejobs.models.json_limits import check_written
from spacejobs.models.kinds.rules import KindRules
from spacejobs.models.results.attempt import AttemptResults
from spacejobs.models.results.records import StoredResult
from spacejobs.tasks.engine import fanout, workflows

if TYPE_CHECKING:
    from spacejobs.models.jobs.store import Child, FanOut, StepPlan, WorkflowState


@dataclass(frozen=True)
class Tenant:
    """One transaction scoped to the job's organization (``ctx.tenant()``): its connection,
    which row-level security confines to that organization's rows, and the organization. The
    application's own repositories are built on it (the demo's: ``Projects.of(tenant)``)."""

    conn: Connection
    organization_id: UUID


class LeaseFlags:
    """What the worker process has learnt about one held lease since it was taken: lost to a
    newer attempt, or asked to cancel. Set by the process's heartbeat thread (and by the job's
    own writes), read by the job's thread at every checkpoint. Plain attributes, not Events: a
    flag is only ever raised, never lowered or waited on, and an attribute's write is atomic,
    while an Event is a Condition and a lock made for every job a claim takes."""

    __slots__ = ("cancel", "lost")

    def __init__(self) -> None:
        self.lost = False
        self.cancel = False

    def note(self, status: Status | None) -> None:
        """Record what the database said about the lease (None: it is no longer ours)."""
        if status is None:
            self.lost = True
        elif status == Status.CANCEL_REQUESTED:
            self.cancel = True


class JobRuntime(Protocol):
    """The database side of a running job (models.jobs.leases.WorkerLeases in a worker; a fake
    in the runner's unit tests)."""

    def tenant(self, job: LeasedJob, rules: KindRules) -> AbstractContextManager[Tenant]: ...

    def record_progress(self, job: LeasedJob, progress: dict[str, Any]) -> Status | None: ...

    def lease_status(self, job: LeasedJob) -> Status | None: ...

    def fan_out_state(self, job: LeasedJob) -> FanOut | None: ...

    def start_fan_out(self, job: LeasedJob, kind: KindRules, items: Sequence[dict[str, Any]],
                      max_parallel: int) -> FanOut | None: ...

    def workflow_state(self, job: LeasedJob) -> WorkflowState | None: ...

    def start_workflow(self, job: LeasedJob, steps: Sequence[StepPlan], policy: str,
                       max_parallel: int | None = None) -> WorkflowState | None: ...

    def step_inputs(self, job: LeasedJob) -> list[Any]: ...

    def children(self, job: LeasedJob) -> list[Child]: ...

    def cancel_children(self, job: LeasedJob) -> int: ...

    def start_failure_handler(self, job: LeasedJob, failure: dict[str, Any],
                              handler: KindRules) -> UUID | None: ...

    def step_result(self, job: LeasedJob, name: str) -> tuple[bool, Any]: ...

    def record_step(self, job: LeasedJob, name: str, result: Any) -> None: ...

    def take_signal(self, job: LeasedJob, name: str, step: str) -> tuple[bool, Any]: ...


class JobContext:
    def __init__(
        self,
        runtime: JobRuntime,
        job: LeasedJob,
        rules: KindRules,
        *,
        flags: LeaseFlags | None = None,
        deadline: float | None = None,
        should_release: Callable[[], bool] | None = None,
        results: AttemptResults | None = None,
        inputs: list[Any] | None = None,
        reads_inputs: bool = False,
    ) -> None:
        self.runtime = runtime
        self.job = job
        self.rules = rules
        self.flags = flags or LeaseFlags()
        self.deadline = deadline  # time.monotonic() value of the soft time limit
        # Asked by the worker's shutdown: True once the grace period for running jobs is over.
        self._should_release = should_release or (lambda: False)
        self.results = results or AttemptResults(None, job)
        # A workflow step's dependencies' results: given (a step made before revision 0042
        # carried them), or read from the database when first asked for (``reads_inputs``).
        self._inputs: list[Any] | None = None if reads_inputs else list(inputs or [])
        # How many waits of each kind this run has reached: the n-th sleep of a run is the n-th
        # sleep of every run of the job, so its record is found again (the step rule).
        self._waits: dict[str, int] = {}

    @property
    def inputs(self) -> list[Any]:
        """A workflow step's dependencies' results, in the order of its dependencies (a chain's
        step: ``ctx.inputs[0]`` is the previous step's); empty outside a workflow. Read from
        the database the first time a run asks (the step's row names its dependencies, never
        copies of their results)."""
        if self._inputs is None:
            self.checkpoint()
            self._inputs = list(self.runtime.step_inputs(self.job))
        return self._inputs

    def tenant(self) -> AbstractContextManager[Tenant]:
        """A NEW transaction scoped to the job's organization (taken from the leased row).

        It first re-reads the requester's membership and the organization's state (and holds
        them until commit), and before committing it locks the job row with our lease token:
        tenant writes commit only while this attempt still holds the job.
        """
        self.checkpoint()
        return _Fenced(self, self.runtime.tenant(self.job, self.rules))

    def progress(self, stage: str, *, done: int | None = None, total: int | None = None) -> None:
        """Record a measured stage; a progress write that finds no lease means the lease is lost."""
        value: dict[str, Any] = {"stage": stage}
        if done is not None:
            value["done"] = done
        if total is not None:
            value["total"] = total
        self.flags.note(self.runtime.record_progress(self.job, value))
        self.checkpoint()

    def store_result(self, source: bytes | IO[bytes], *, content_type: str,
                     filename: str) -> StoredResult:
        """Put a large result (a file: a ZIP, a CSV...) in the results store and return what the
        kind then returns as its result. The web serves it from ``…/result`` with this content
        type, as an attachment named ``filename``, to current members holding the kind's role.

        The file is written now, before the finish; if the attempt does not finish with it (an
        exception, a lost lease, a stale finish) it is deleted again. ``source`` is bytes or a
        binary file object read to its end (a ``tempfile.SpooledTemporaryFile`` keeps a large
        one out of memory).
        """
        self.checkpoint()
        return self.results.put(source, content_type=content_type, filename=filename)

    def checkpoint(self) -> None:
        """A safe point: stop here if the lease is lost, a cancel was asked for, time is up, or
        the worker is shutting down and may wait no longer."""
        if self.flags.lost:
            raise LeaseLost()
        if self.flags.cancel:
            raise CancelRequested()
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise TimedOut(permanent=not self.rules.retry_on_timeout)
        if self._should_release():
            raise ReleaseRequested()

    def fan_out(self, kind: str, items: Sequence[dict[str, Any]], *, max_parallel: int = 4
                ) -> list[Any]:
        """One child job of ``kind`` per item, at most ``max_parallel`` at a time; their results
        in input order (spacejobs.tasks.engine.fanout)."""
        return fanout.fan_out(self, kind, items, max_parallel=max_parallel)

    def workflow(self, canvas: canvases.Canvas, *, policy: canvases.Policy = "fail_fast",
                 max_parallel: int | None = None) -> dict[str, Any]:
        """Run a canvas (``chain``, ``group``, ``chord``, ``graph`` of ``sig``) as this job's
        children, waiting without a worker between them, and return ``{"steps": {name:
        result}, "result": …}`` (spacejobs.tasks.engine.workflows). Its steps may be child-only kinds;
        at most ``max_parallel`` of them run at a time when given. Raises StepsFailed as a
        submitted workflow fails."""
        return workflows.run_canvas(self, canvas, policy=policy, max_parallel=max_parallel)

    # -- durable steps and waits ---------------------------------------------------------------
    #
    # A job that waits ends its run and is run again from the top once what it waits for has
    # come. What came before a wait must not be done twice: wrap it in a step, whose result is
    # recorded in the lease holder's fenced transaction and returned, without running it, on
    # every later run. The rule for a kind: between steps and waits, do only what gives the
    # same answer every time (no clock, no random, no reads that may change), so each run
    # reaches the same steps and waits in the same order.

    def step(self, name: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` once for the job: its JSON-able result is recorded under ``name`` and
        returned again on every later run (after a wait, a crash, a retry)."""
        self.checkpoint()
        found, value = self.runtime.step_result(self.job, name)
        if found:
            return value
        # A span when the step runs (not when its record answers): the job's id, never the
        # step's name, which is the kind's own words.
        with tracing.span("spacejobs.step", {"spacejobs.job.id": str(self.job.id)}):
            value = fn()
            self.checkpoint()
            self.runtime.record_step(self.job, name, _jsonable(value, name))
        return value

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` without holding a worker (measured from the first run that got
        here: a later run does not start the timer again)."""
        self.sleep_until(datetime.now(UTC) + timedelta(seconds=max(0.0, seconds)))

    def sleep_until(self, moment: datetime) -> None:
        """Wait until ``moment`` (aware) without holding a worker."""
        if moment.tzinfo is None:
            raise ValueError("sleep_until needs an aware datetime")
        name = self.next_step_name("sleep")
        until = datetime.fromisoformat(self.step(name, lambda: moment.astimezone(UTC).isoformat()))
        if datetime.now(UTC) < until:
            raise WaitRequested(until=until)

    def wait_for_signal(self, name: str, *, timeout: float) -> Any:
        """Wait, without holding a worker, for the signal ``name`` (sent to this job through
        the API or ``Jobs.signal``) and return its payload; one signal is taken per wait, in
        the order they came, and one sent before the wait is kept for it. SignalTimeout once
        ``timeout`` seconds have passed without one (from the first run that got here).
        :meth:`receive_signal` is the same wait, answering who sent it too."""
        return self.receive_signal(name, timeout=timeout).payload

    def receive_signal(self, name: str, *, timeout: float) -> Signal:
        """:meth:`wait_for_signal`, answering the whole :class:`Signal`: its payload, and who
        sent it with the role they held then, as the database recorded them. An approval
        trusts ``signal.sender_role``, never a field the sender wrote into the payload."""
        step = self.next_step_name(f"signal:{name}")
        found, recorded = self.runtime.step_result(self.job, step)
        if found:
            return Signal.from_record(name, recorded)
        deadline = datetime.fromisoformat(self.step(
            step + ":deadline",
            lambda: (datetime.now(UTC) + timedelta(seconds=max(0.0, timeout))).isoformat()))
        self.checkpoint()
        taken, recorded = self.runtime.take_signal(self.job, name, step)
        if taken:
            return Signal.from_record(name, recorded)
        if datetime.now(UTC) >= deadline:
            # The timeout is the wait's outcome, recorded as a signal would be: every later run
            # (after the kind caught it and slept, say) meets the same timeout here, and a
            # signal that comes late stays for a later wait rather than change the past.
            self.checkpoint()
            self.runtime.record_step(self.job, step, {_TIMED_OUT: deadline.isoformat()})
            raise SignalTimeout()
        raise WaitRequested(signal=name, until=deadline)

    def next_step_name(self, what: str) -> str:
        """``what#n`` for the n-th time this run asks for ``what``: the same name on every run
        that follows the step rule (for waits and helpers that record their own steps)."""
        count = self._waits[what] = self._waits.get(what, 0) + 1
        return f"{what}#{count}"

    def check_lease_now(self) -> None:
        """Checkpoint after asking the database (the heartbeat does this in the background)."""
        self.flags.note(self.runtime.lease_status(self.job))
        self.checkpoint()

    @property
    def lease_lost(self) -> bool:
        return self.flags.lost


@dataclass(frozen=True)
class Signal:
    """A signal a wait took: its payload, and who sent it with the role they held in the
    organization when they sent it (``sent_by``/``sender_role`` are None only for a signal
    taken before senders were recorded, revision 0039)."""

    name: str
    payload: Any
    sent_by: UUID | None
    sender_role: str | None
    sent_at: datetime | None

    @classmethod
    def from_record(cls, name: str, recorded: Any) -> Signal:
        """The signal as its step recorded it (take_signal() in the schema); SignalTimeout
        again for a wait whose recorded outcome was its timeout."""
        if isinstance(recorded, dict) and set(recorded) == {_TIMED_OUT}:
            raise SignalTimeout()
        if isinstance(recorded, dict) and set(recorded) == {_TAKEN_SIGNAL}:
            taken = recorded[_TAKEN_SIGNAL]
            return cls(name, taken.get("payload"),
                       UUID(taken["sent_by"]) if taken.get("sent_by") else None,
                       taken.get("sender_role"),
                       datetime.fromisoformat(taken["sent_at"]) if taken.get("sent_at") else None)
        return cls(name, recorded, None, None, None)  # recorded before revision 0039: the payload


#: the one key of a taken signal's step record (take_signal() in the schema)
_TAKEN_SIGNAL = "_taken_signal"
#: the one key of the step record of a wait that timed out (its deadline)
_TIMED_OUT = "_signal_timed_out"


def _jsonable(value: Any, name: str) -> Any:
    # Nested past the limit: ResultNotStorable, which fails the attempt at once (before the
    # encoder below recurses into it, and instead of a later run that could not read it).
    check_written(value, "A step's value")
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        raise TypeError(f"the step {name!r} returned something that is not JSON") from None
    return value


class _Fenced(AbstractContextManager[Tenant]):
    """The tenant transaction, marking the lease lost when its fence refused the commit."""

    def __init__(self, ctx: JobContext, inner: AbstractContextManager[Tenant]) -> None:
        self._ctx = ctx
        self._inner = inner

    def __enter__(self) -> Tenant:
        return self._inner.__enter__()

    def __exit__(self, *exc_info: Any) -> bool | None:
        try:
            return self._inner.__exit__(*exc_info)
        except LeaseLost:
            self._ctx.flags.lost = True
            raise
