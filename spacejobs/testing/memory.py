"""Run a kind in memory: the kind's own function, with the engine's own :class:`JobContext`, over
a runtime that keeps the job's steps, progress, signals and children in this object instead of
PostgreSQL. For the pure logic of a kind (what it computes, which steps and waits it reaches,
what it does with a signal), in milliseconds and without a database::

    from spacejobs import testing

    result = testing.run_in_memory(approval, {"title": "Q4"},
                                   signals=[testing.SentSignal("approved", {}, sender_role="admin")])

What is the engine's here, not a copy: the context (steps, sleeps, signal waits, checkpoints,
progress, ``fan_out``, ``workflow``), the decision the runner makes of how a run ended
(``action_for``), and the result's own checks (a value PostgreSQL could not store fails as it
would in a worker). What is in memory: the job's row. Time moves only when asked
(:meth:`MemoryJob.advance`), by moving the moments the job recorded, as
:meth:`spacejobs.testing.Harness.advance` does in the database.

Not here: ``ctx.tenant()`` has no database (pass ``conn=`` for what it should yield as
``tenant.conn``, or test that part against PostgreSQL with :class:`spacejobs.testing.Harness`);
membership, organization state, quotas, rate limits and leases are the database's to check.
"""

from __future__ import annotations

import inspect
import json
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from spacejobs.models.errors import DomainError, InternalJobError, WaitRequested
from spacejobs.models.jobs.records import ACTIVE, LeasedJob, Status
from spacejobs.models.jobs.store import Child, FanOut, StepPlan, WorkflowState
from spacejobs.models.kinds import JobKind, KindRules, Params, get_any_kind, registered_kinds
from spacejobs.models.results.attempt import DEFAULT_INLINE_MAX_BYTES, AttemptResults
from spacejobs.models.results.store import ResultStore
from spacejobs.tasks.engine.attempt import Action, action_for
from spacejobs.tasks.engine.context import JobContext, LeaseFlags, Tenant
from spacejobs.tasks.engine.ends import Outcome

__all__ = ["MemoryJob", "MemoryRun", "NeedsDatabase", "NotCompleted", "NotDue", "SentSignal",
           "run_in_memory"]

#: the names under which the context records the moments it waits for (a sleep's, and the
#: deadline of a signal's wait): what moving time moves (JobContext.sleep_until, receive_signal)
TIMER_STEP_PREFIX = "sleep#"
DEADLINE_STEP_SUFFIX = ":deadline"


class NotCompleted(AssertionError):
    """The job cannot run to its end here: it waits for a signal nobody sent, it was
    cancelled, or it ran too many times. The message says which."""


class NotDue(AssertionError):
    """Asked to run a job that is not due: it waits (for a moment, a signal) or has ended."""


class NeedsDatabase(RuntimeError):
    """The kind asked for what only PostgreSQL has (``ctx.tenant()`` without ``conn=``)."""


@dataclass(frozen=True)
class SentSignal:
    """A signal to send to the job: its name and payload, and who sent it with the role they
    held (what ``ctx.receive_signal`` answers as ``sent_by`` and ``sender_role``; ``sent_by``
    None: the job's requester)."""

    name: str
    payload: Any = None
    sender_role: str = "member"
    sent_by: UUID | None = None


@dataclass(frozen=True)
class MemoryRun:
    """How one run of a :class:`MemoryJob` ended: the engine's :class:`Outcome` (``completed``,
    ``waiting``, ``resumed``: it asked to wait for what had already come, ``retry``,
    ``failed``, ``cancelled``), the exception it raised (a failure's), and what it waits for."""

    outcome: Outcome
    attempt: int
    error: BaseException | None = None
    waits_for: WaitRequested | None = None


@dataclass
class _Pending:
    signal: SentSignal
    sent_by: UUID
    sent_at: datetime


class MemoryJob:
    """One job of ``kind`` held in memory, run one run at a time (:meth:`run`) or to its end
    (:meth:`run_until_done`), as a worker would run it from its row.

    ``kind``: its name, its ``JobKind``, or the function ``@job_kind`` decorated. ``params``:
    a dict (validated by the kind's params model, as a submit does) or the model itself.
    ``conn``: what ``ctx.tenant()`` yields as ``tenant.conn`` (a fake of your repositories'
    connection, or a real one your test opened); without it ``ctx.tenant()`` raises
    :class:`NeedsDatabase`. ``results``: the results store ``ctx.store_result`` writes to
    (without one, storing a file raises as on a worker without a store). ``raise_errors``: an
    exception that is not a ``DomainError`` (a bug) is raised out of :meth:`run` instead of
    being recorded as ``internal_error`` and retried, as a worker does.

    What it recorded: :attr:`steps` (name → value, as the database would return them),
    :attr:`progress` (every ``ctx.progress``), :attr:`children` (a fan-out's or a workflow's,
    each a MemoryJob), :attr:`runs`, and :attr:`status`, :attr:`result`, :attr:`error`.
    """

    def __init__(self, kind: str | JobKind | Any, params: Params | Mapping[str, Any] | None = None,
                 *, organization_id: UUID | None = None, requested_by: UUID | None = None,
                 conn: Any = None, results: ResultStore | None = None,
                 inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES, raise_errors: bool = True,
                 inputs: Sequence[Any] = (), index: int | None = None) -> None:
        self.kind = resolve_kind(kind)
        self.params = _validated(self.kind, params)
        self.id = uuid.uuid4()
        self.organization_id = organization_id or uuid.uuid4()
        self.requested_by = requested_by or uuid.uuid4()
        self.conn = conn
        self.results = results
        self.inline_max_bytes = inline_max_bytes
        self.raise_errors = raise_errors
        #: a workflow step's ``ctx.inputs``; its place among its parent's children
        self.inputs = list(inputs)
        self.index = index
        self.status = Status.QUEUED
        self.attempt = 1
        self.steps: dict[str, Any] = {}
        self.progress: list[dict[str, Any]] = []
        self.children: list[MemoryJob] = []
        self.runs: list[MemoryRun] = []
        self.result: Any = None
        self.result_ref: str | None = None
        self.error: BaseException | None = None
        self.waits_for: WaitRequested | None = None
        self._pending: list[_Pending] = []
        self._cancel = False
        self._fan_out: FanOut | None = None
        self._workflow: WorkflowState | None = None

    @property
    def rules(self) -> KindRules:
        return self.kind.rules

    @property
    def error_code(self) -> str | None:
        return self.error.code if isinstance(self.error, DomainError) else None

    # -- what happens to the job from outside ---------------------------------------------------
    def signal(self, name: str, payload: Any = None, *, sender_role: str = "member",
               sent_by: UUID | None = None) -> Status:
        """Send a signal, as ``Jobs.signal`` does: kept until a wait takes it; a job waiting
        for that name goes back to the queue. Returns the job's status after it."""
        return self.send(SentSignal(name, payload, sender_role, sent_by))

    def send(self, sent: SentSignal) -> Status:
        if self.status.terminal:
            raise NotDue(f"the job is {self.status}: it takes no more signals")
        json.dumps(sent.payload, allow_nan=False)  # a payload is JSON, as the API holds it to
        self._pending.append(_Pending(sent, sent.sent_by or self.requested_by, datetime.now(UTC)))
        if self.status == Status.WAITING and self.waits_for and self.waits_for.signal == sent.name:
            self._resume()
        return self.status

    def advance(self, seconds: float = 0.0, *, minutes: float = 0.0, hours: float = 0.0,
                days: float = 0.0) -> Status:
        """Let this much time pass for the job: the moments it recorded (a sleep's end, a signal
        wait's deadline) come that much sooner, and a job whose moment has now come goes back
        to the queue. Returns its status."""
        delta = timedelta(seconds=seconds, minutes=minutes, hours=hours, days=days)
        if delta < timedelta(0):
            raise ValueError("time only moves forward")
        for child in self.children:
            child.advance(delta.total_seconds())
        for name, value in list(self.steps.items()):
            moment = _moment(value) if _is_timer(name) else None
            if moment is not None:
                self.steps[name] = (moment - delta).isoformat()
        waiting = self.waits_for
        if self.status == Status.WAITING and waiting is not None and isinstance(waiting.until, datetime):
            until = waiting.until - delta
            self.waits_for = WaitRequested(until=until, signal=waiting.signal,
                                           children=waiting.children)
            if until <= datetime.now(UTC):
                self._resume()
        return self.status

    def cancel(self) -> Status:
        """Cancel it, as a member does: a queued or waiting job is cancelled at once (and its
        children with it)."""
        if self.status in (Status.QUEUED, Status.WAITING):
            self.status = Status.CANCELLED
            self.waits_for = None
            for child in self.children:
                child.cancel()
        elif self.status == Status.LEASED:
            self._cancel = True
        return self.status

    # -- running -------------------------------------------------------------------------------
    def context(self) -> JobContext:
        """A context for one run of the job, over this job's memory: for a test that calls the
        kind's function itself (a wait then raises the engine's ``WaitRequested``)."""
        leased = LeasedJob(id=self.id, organization_id=self.organization_id,
                           requested_by=self.requested_by, kind=self.rules.name,
                           params=dict(self.params), attempt=self.attempt,
                           max_attempts=self.rules.max_attempts, lease_token=uuid.uuid4(),
                           lease_seconds=self.rules.lease_seconds, request_id=None)
        flags = LeaseFlags()
        if self._cancel:
            flags.cancel = True
        limit = self.rules.time_limit
        return JobContext(_Runtime(self), leased, self.rules, flags=flags,
                          deadline=time.monotonic() + limit if limit else None,
                          results=AttemptResults(self.results, leased,
                                                 inline_max_bytes=self.inline_max_bytes),
                          inputs=self.inputs)

    def run(self) -> Outcome:
        """One run, from the top of the kind's function, as a worker's attempt: how it ended.
        A job whose moment has passed by itself is resumed first, as beat would have."""
        self.advance(0)
        if self.status != Status.QUEUED:
            raise NotDue(self._why_not_due())
        ctx = self.context()
        self.status = Status.LEASED
        try:
            value = self.kind.run(ctx, self.kind.parse_params(dict(self.params)))
            result, ref = ctx.results.settle(value)
        except (NotCompleted, NotDue):
            self.status = Status.QUEUED  # a child could not run here: the test is told why
            raise
        except Exception as exc:
            ctx.results.discard()
            return self._ended_by(exc)
        finally:
            self._cancel = False
        self.status, self.result, self.result_ref, self.error = Status.COMPLETED, result, ref, None
        return self._ran(Outcome.COMPLETED)

    def run_until_done(self, *, max_runs: int = 100) -> Any:
        """Run until the job has ended; its result. A sleep is slept at once (time is moved to
        its moment); a retry runs at once. Raises the error a failed job ended with (the
        kind's ``DomainError``, or with ``raise_errors`` the bug itself), and
        :class:`NotCompleted` when it waits for a signal nobody sent or was cancelled."""
        self.settle(max_runs=max_runs)
        if self.status == Status.COMPLETED:
            return self.result
        if self.status == Status.FAILED and self.error is not None:
            raise self.error
        raise NotCompleted(f"job {self.rules.name} ended {self.status}")

    def settle(self, *, max_runs: int = 100) -> Status:
        """Run until the job has ended (or waits for a signal nobody sent: NotCompleted), as
        :meth:`run_until_done`, without raising the error a failed job ended with."""
        for _ in range(max_runs):
            if self.status.terminal:
                return self.status
            if self.status == Status.WAITING:
                waiting = self.waits_for
                if waiting is None or waiting.signal is not None or waiting.until is None:
                    raise NotCompleted(self._why_not_due())
                assert isinstance(waiting.until, datetime)
                self.advance(max(0.0, (waiting.until - datetime.now(UTC)).total_seconds()) + 0.001)
                continue
            self.run()
        if self.status.terminal:
            return self.status
        raise NotCompleted(f"job {self.rules.name} ran {max_runs} times without ending "
                           f"(it is {self.status})")

    # -- how a run ended (the engine's decision, recorded here) --------------------------------
    def _ended_by(self, exc: Exception) -> Outcome:
        action = action_for(exc)
        if action is Action.WAIT:
            assert isinstance(exc, WaitRequested)
            return self._wait(exc)
        if action is Action.ACKNOWLEDGE_CANCEL:
            self.status = Status.CANCELLED
            return self._ran(Outcome.CANCELLED)
        if action is Action.FAIL:
            assert isinstance(exc, DomainError)
            return self._fail(exc, exc)
        if action is Action.FAIL_INTERNAL and not self.raise_errors:
            return self._fail(exc, InternalJobError())
        self.status, self.error = Status.FAILED, exc
        self._ran(Outcome.FAILED, error=exc)
        raise exc

    def _fail(self, exc: Exception, error: DomainError) -> Outcome:
        self.error = exc
        if error.permanent or self.attempt >= self.rules.max_attempts:
            self.status = Status.FAILED
            return self._ran(Outcome.FAILED, error=exc)
        self.status = Status.QUEUED
        outcome = self._ran(Outcome.RETRY, error=exc)
        self.attempt += 1
        return outcome

    def _wait(self, request: WaitRequested) -> Outcome:
        until = request.until if isinstance(request.until, datetime) else None
        met = ((until is not None and until <= datetime.now(UTC))
               or (request.signal is not None
                   and any(p.signal.name == request.signal for p in self._pending))
               or (request.children is not None
                   and not any(c.status in ACTIVE for c in self.children))
               or (until is None and request.signal is None and request.children is None))
        if met:
            self.status, self.waits_for = Status.QUEUED, None
            return self._ran(Outcome.RESUMED, waits_for=request)
        self.status, self.waits_for = Status.WAITING, request
        return self._ran(Outcome.WAITING, waits_for=request)

    def _resume(self) -> None:
        self.status, self.waits_for = Status.QUEUED, None

    def _ran(self, outcome: Outcome, *, error: BaseException | None = None,
             waits_for: WaitRequested | None = None) -> Outcome:
        self.runs.append(MemoryRun(outcome, self.attempt, error, waits_for))
        return outcome

    def _why_not_due(self) -> str:
        name = self.rules.name
        waiting = self.waits_for
        if self.status != Status.WAITING or waiting is None:
            return f"job {name} is {self.status}, not queued"
        if waiting.signal is not None:
            return (f"job {name} waits for the signal {waiting.signal!r} (until {waiting.until}): "
                    "send it (signals= or .signal()), or advance() past its timeout")
        if waiting.children is not None:
            return f"job {name} waits for its children"
        return f"job {name} waits until {waiting.until}: advance() the time first"

    # -- what the runtime does for it ------------------------------------------------------------
    def _take_signal(self, name: str, step: str) -> tuple[bool, Any]:
        for place, pending in enumerate(self._pending):
            if pending.signal.name == name:
                del self._pending[place]
                recorded = {"_taken_signal": {
                    "payload": _as_stored(pending.signal.payload),
                    "sent_by": str(pending.sent_by),
                    "sender_role": pending.signal.sender_role,
                    "sent_at": pending.sent_at.isoformat()}}
                self.steps.setdefault(step, recorded)
                return True, self.steps[step]
        return False, None

    def _child(self, kind: str, params: Mapping[str, Any], index: int,
               inputs: Sequence[Any] = ()) -> MemoryJob:
        child = MemoryJob(kind, params, organization_id=self.organization_id,
                          requested_by=self.requested_by, conn=self.conn, results=self.results,
                          inline_max_bytes=self.inline_max_bytes, raise_errors=self.raise_errors,
                          inputs=inputs, index=index)
        self.children.append(child)
        try:
            child.settle()
        except NotCompleted as stuck:
            raise NotCompleted(f"child #{index} ({kind}) of job {self.rules.name}: {stuck}") from None
        return child

    def _start_fan_out(self, kind: KindRules, items: Sequence[dict[str, Any]]) -> FanOut:
        for index, item in enumerate(items):
            self._child(kind.name, item, index)
        self._fan_out = FanOut(len(items), len(items), len(items))
        return self._fan_out

    def _start_workflow(self, steps: Sequence[StepPlan], policy: str) -> WorkflowState:
        """The database's release of a workflow's steps, in memory, in waves: the steps whose
        dependencies have all ended are released together (a step whose dependency did not
        complete never is); under ``fail_fast`` none after a wave in which one failed."""
        made: dict[int, MemoryJob] = {}
        left = list(range(len(steps)))
        while left:
            if policy == "fail_fast" and any(c.status != Status.COMPLETED for c in made.values()):
                break
            ready = [i for i in left if all(d in made for d in steps[i].after + steps[i].waits)]
            if not ready:
                break  # what is left waits for a step never made
            for place in ready:
                left.remove(place)
                step = steps[place]
                if all(made[d].status == Status.COMPLETED for d in step.after + step.waits):
                    made[place] = self._child(step.kind.name, step.params, place,
                                              [made[d].result for d in step.after])
        failed = sum(1 for c in made.values() if c.status != Status.COMPLETED)
        self._workflow = WorkflowState(len(steps), len(made), len(made), failed)
        return self._workflow


class _Runtime:
    """The context's runtime (spacejobs.tasks.engine.context.JobRuntime) over one MemoryJob."""

    def __init__(self, job: MemoryJob) -> None:
        self.job = job

    def _status(self) -> Status:
        return Status.CANCEL_REQUESTED if self.job._cancel else Status.LEASED

    @contextmanager
    def tenant(self, job: LeasedJob, rules: KindRules) -> Iterator[Tenant]:
        if self.job.conn is None:
            raise NeedsDatabase(
                "ctx.tenant() needs a database: pass conn=... (what tenant.conn should be) to "
                "run_in_memory or MemoryJob, or run the kind against PostgreSQL with "
                "spacejobs.testing.Harness")
        yield Tenant(self.job.conn, job.organization_id)

    def record_progress(self, job: LeasedJob, progress: dict[str, Any]) -> Status | None:
        self.job.progress.append(dict(progress))
        return self._status()

    def lease_status(self, job: LeasedJob) -> Status | None:
        return self._status()

    def fan_out_state(self, job: LeasedJob) -> FanOut | None:
        return self.job._fan_out

    def start_fan_out(self, job: LeasedJob, kind: KindRules, items: Sequence[dict[str, Any]],
                      max_parallel: int) -> FanOut | None:
        return self.job._start_fan_out(kind, items)

    def workflow_state(self, job: LeasedJob) -> WorkflowState | None:
        return self.job._workflow

    def start_workflow(self, job: LeasedJob, steps: Sequence[StepPlan], policy: str,
                       max_parallel: int | None = None) -> WorkflowState | None:
        return self.job._start_workflow(steps, policy)

    def step_inputs(self, job: LeasedJob) -> list[Any]:
        return list(self.job.inputs)

    def children(self, job: LeasedJob) -> list[Child]:
        return [Child(c.index if c.index is not None else place, c.id, c.status, c.result,
                      c.error_code, str(c.error) if isinstance(c.error, DomainError) else None)
                for place, c in enumerate(self.job.children)]

    def start_failure_handler(self, job: LeasedJob, failure: dict[str, Any],
                              handler: KindRules) -> UUID | None:
        raise NeedsDatabase("A workflow's failure handler is a job of its own: run the "
                            "workflow against the database (a worker) to see it made.")

    def cancel_children(self, job: LeasedJob) -> int:
        active = [c for c in self.job.children if c.status in ACTIVE]
        for child in active:
            child.cancel()
        return len(active)

    def step_result(self, job: LeasedJob, name: str) -> tuple[bool, Any]:
        return name in self.job.steps, self.job.steps.get(name)

    def record_step(self, job: LeasedJob, name: str, result: Any) -> None:
        self.job.steps.setdefault(name, _as_stored(result))

    def take_signal(self, job: LeasedJob, name: str, step: str) -> tuple[bool, Any]:
        return self.job._take_signal(name, step)


def run_in_memory(kind: str | JobKind | Any, params: Params | Mapping[str, Any] | None = None, *,
                  signals: Mapping[str, Any] | Iterable[SentSignal] | None = None,
                  conn: Any = None, results: ResultStore | None = None,
                  organization_id: UUID | None = None, requested_by: UUID | None = None,
                  raise_errors: bool = True, max_runs: int = 100) -> Any:
    """Run a kind in memory to its end and return its result (:class:`MemoryJob` says what is
    in memory and what is not). ``signals``: sent before the first run, each kept for a wait
    of its name, in order: ``{"approve": payload}`` (sent by the requester, as a member), or
    :class:`SentSignal`\\ s for several of one name or another sender's role. Sleeps pass at
    once; a fan-out's or workflow's children run in memory too (each a :class:`MemoryJob` in
    the parent's ``children``). Raises what the job failed with, or :class:`NotCompleted`
    when it waits for a signal that was not given. For the steps, progress and children it
    recorded, build a :class:`MemoryJob` and call :meth:`MemoryJob.run_until_done` instead."""
    job = MemoryJob(kind, params, organization_id=organization_id, requested_by=requested_by,
                    conn=conn, results=results, raise_errors=raise_errors)
    for sent in _signals(signals):
        job.send(sent)
    return job.run_until_done(max_runs=max_runs)


def resolve_kind(kind: str | JobKind | Any) -> JobKind:
    """A registered kind from its name, itself, or the function ``@job_kind`` decorated."""
    if isinstance(kind, JobKind):
        return kind
    if isinstance(kind, str):
        return get_any_kind(kind)
    for found in registered_kinds().values():
        if found.run is kind or inspect.unwrap(found.run) is inspect.unwrap(kind):
            return found
    raise LookupError(f"{kind!r} is not a registered kind: decorate it with @job_kind and import "
                      "its module before the test runs it")


def _validated(kind: JobKind, params: Params | Mapping[str, Any] | None) -> dict[str, Any]:
    """The params as a submit stores them: read by the kind's model, as JSON."""
    if isinstance(params, Params):
        params = params.model_dump(mode="json")
    dumped: dict[str, Any] = kind.parse_params(dict(params or {})).model_dump(mode="json")
    return dumped


def _signals(signals: Mapping[str, Any] | Iterable[SentSignal] | None) -> list[SentSignal]:
    if signals is None:
        return []
    if isinstance(signals, Mapping):
        return [SentSignal(name, payload) for name, payload in signals.items()]
    found = list(signals)
    for each in found:
        if not isinstance(each, SentSignal):
            raise TypeError("signals= takes a dict {name: payload} or SentSignal(...)s")
    return found


def _is_timer(name: str) -> bool:
    return name.startswith(TIMER_STEP_PREFIX) or (
        name.startswith("signal:") and name.endswith(DEADLINE_STEP_SUFFIX))


def _moment(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _as_stored(value: Any) -> Any:
    """A value as the database gives it back (JSON: a tuple comes back a list)."""
    return json.loads(json.dumps(value, allow_nan=False))
