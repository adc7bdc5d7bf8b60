"""Job kinds that exist only for tests (loaded through SPACEJOBS_EXTRA_KIND_MODULES)."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Annotated, Any, Literal

from pydantic import Field
from sqlalchemy import text

from spacejobs.demo.projects import Projects
from spacejobs.models.errors import DomainError, SignalTimeout
from spacejobs.models.kinds import NoParams, Params, job_kind
from spacejobs.tasks.engine.context import JobContext

# Planted in exceptions: it must never reach error_message, an HTTP body or a user.
SECRET_MARKER = "SECRET-7f3a postgresql://space:hunter2@db.internal/tenants"


@job_kind("test.fail", org_states={"active"}, max_attempts=3, backoff=0.4, backoff_max=2)
def always_fails(ctx: JobContext, params: NoParams) -> dict[str, Any]:
    with ctx.tenant() as tenant:
        Projects.of(tenant).list()
    raise RuntimeError(f"boom: {SECRET_MARKER}")


class StallParams(Params):
    seconds: Annotated[float, Field(ge=0, le=30)] = 0
    #: how long the second and later attempts stall (default: as long as the first)
    retry_seconds: Annotated[float | None, Field(ge=0, le=30)] = None


@job_kind("test.stall", org_states={"active"}, max_attempts=3, backoff=0.2,
          lease=timedelta(seconds=2), params=StallParams)
def stall(ctx: JobContext, params: StallParams) -> dict[str, Any]:
    """Sleeps WITHOUT checkpoints, then returns who ran it: a late finisher, on purpose."""
    retry = params.seconds if params.retry_seconds is None else params.retry_seconds
    time.sleep(params.seconds if ctx.job.attempt == 1 else retry)
    return {"pid": os.getpid(), "attempt": ctx.job.attempt}


@job_kind("test.soft_limit", org_states={"active"}, max_attempts=2, time_limit=1.0)
def overruns_with_checkpoints(ctx: JobContext, params: NoParams) -> dict[str, Any]:
    for _ in range(100):
        time.sleep(0.1)
        ctx.checkpoint()
    return {"finished": True}


@job_kind("test.hang", org_states={"active"}, max_attempts=2, time_limit=0.5, hard_time_limit=1.5)
def hangs_without_checkpoints(ctx: JobContext, params: NoParams) -> dict[str, Any]:
    time.sleep(30)
    return {"finished": True}


class PartParams(Params):
    n: int
    seconds: Annotated[float, Field(ge=0, le=30)] = 0
    fail: bool = False


@job_kind("test.part", org_states={"active"}, max_attempts=3, backoff=0.2,
          lease=timedelta(seconds=3), params=PartParams, child_only=True)
def part(ctx: JobContext, params: PartParams) -> dict[str, Any]:
    """One child of test.fan: sleeps with checkpoints, then answers its number (or fails)."""
    deadline = time.monotonic() + params.seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
        ctx.checkpoint()
    if params.fail:
        raise PartRefused()  # permanent: a domain error does not retry
    return {"n": params.n, "square": params.n * params.n}


class PartRefused(DomainError):
    code = "part_refused"
    message = "This part was told to fail."


class FanParams(Params):
    parts: list[PartParams]
    max_parallel: Annotated[int, Field(ge=1, le=16)] = 2


@job_kind("test.fan", org_states={"active"}, max_attempts=10, lease=timedelta(seconds=3),
          params=FanParams)
def fan(ctx: JobContext, params: FanParams) -> dict[str, Any]:
    return {"parts": ctx.fan_out("test.part", [p.model_dump() for p in params.parts],
                                 max_parallel=params.max_parallel)}


class ReportOfParams(Params):
    project_ids: Annotated[list[str], Field(min_length=1, max_length=10)]


@job_kind("test.report_of", org_states={"active"}, max_attempts=1, params=ReportOfParams)
def report_of(ctx: JobContext, params: ReportOfParams) -> dict[str, Any]:
    """A parent that hands a member's strings on as project ids, unchecked: the part's own
    params model is all that stands between them and PostgreSQL."""
    return {"projects": ctx.fan_out("projects_report.project",
                                    [{"project_id": each} for each in params.project_ids])}


class CastParams(Params):
    #: the text to cast; None: every project's name
    value: str | None = None


@job_kind("test.cast_to_uuid", org_states={"active"}, max_attempts=1, params=CastParams)
def cast_to_uuid(ctx: JobContext, params: CastParams) -> dict[str, Any]:
    """Hands the tenant's text (its params, or its projects' names) to PostgreSQL as a uuid,
    as projects_report.project once did: PostgreSQL's refusal quotes the text back."""
    with ctx.tenant() as tenant:
        if params.value is not None:
            tenant.conn.execute(text("SELECT CAST(:value AS uuid)"), {"value": params.value})
        else:
            tenant.conn.execute(text("SELECT CAST(name AS uuid) FROM projects"))
    return {}


class EchoParams(Params):
    value: Annotated[str, Field(max_length=200)]


@job_kind("test.unstorable_result", org_states={"active"}, max_attempts=1,
          lease=timedelta(seconds=2), params=EchoParams)
def unstorable_result(ctx: JobContext, params: EchoParams) -> dict[str, Any]:
    """A result PostgreSQL's jsonb cannot hold (a NUL), which it would refuse quoting the JSON
    up to it; the attempt refuses it first (models.results.attempt.encode_result)."""
    return {"echo": params.value + "\x00"}


@job_kind("test.admin_file", org_states={"active"}, role="admin")
def admin_file(ctx: JobContext, params: NoParams) -> Any:
    """A stored result only admins may read (the kind's role)."""
    return ctx.store_result(b"for admins only", content_type="text/plain", filename="admins.txt")


@job_kind("test.stall_file", org_states={"active"}, max_attempts=3, backoff=0.2,
          lease=timedelta(seconds=2), params=StallParams)
def stall_file(ctx: JobContext, params: StallParams) -> Any:
    """Stores its file first, then (first attempt only) sleeps WITHOUT checkpoints: the file is
    in the store while the attempt stalls, is killed, or finishes too late."""
    stored = ctx.store_result(f"attempt {ctx.job.attempt}".encode(), content_type="text/plain",
                              filename="stalled.txt")
    if ctx.job.attempt == 1:
        time.sleep(params.seconds)
    return stored


@job_kind("test.capped", org_states={"active"}, quota=2)
def capped(ctx: JobContext, params: NoParams) -> dict[str, Any]:
    """A kind that declares its own quota: at most 2 active per organization."""
    return {}


class StepThenSleepParams(Params):
    project: Annotated[str, Field(min_length=1, max_length=100)]
    seconds: Annotated[float, Field(ge=0, le=30)] = 1.0


@job_kind("test.step_then_sleep", org_states={"active"}, max_attempts=3, backoff=0.2)
def step_then_sleep(ctx: JobContext, params: StepThenSleepParams) -> dict[str, Any]:
    """A step with a visible effect (a project), a durable sleep, then a second step: a resumed
    run must not create the project again."""

    def create() -> str:
        with ctx.tenant() as tenant:
            return str(Projects.of(tenant).create(params.project, "made by a step").id)

    made = ctx.step("create project", create)
    ctx.sleep(params.seconds)
    runs = ctx.step("after the sleep", lambda: os.getpid())
    return {"project_id": made, "after_pid": runs, "attempt": ctx.job.attempt}


class TwoSignalsParams(Params):
    name: Annotated[str, Field(pattern=r"^[a-z]{1,20}$")]


@job_kind("test.two_signals", org_states={"active"}, max_attempts=3, backoff=0.2)
def two_signals(ctx: JobContext, params: TwoSignalsParams) -> dict[str, Any]:
    """Waits twice for the same signal's name: each wait takes one, in the order they came."""
    first = ctx.wait_for_signal(params.name, timeout=60)
    second = ctx.wait_for_signal(params.name, timeout=60)
    return {"first": first, "second": second}


class ApproveOrEscalateParams(Params):
    timeout: Annotated[float, Field(ge=0, le=60)] = 0.5
    then_sleep: Annotated[float, Field(ge=0, le=60)] = 2.0


@job_kind("test.approve_or_escalate", org_states={"active"}, max_attempts=3, backoff=0.2,
          params=ApproveOrEscalateParams)
def approve_or_escalate(ctx: JobContext, params: ApproveOrEscalateParams) -> dict[str, Any]:
    """"Approve within the timeout, else escalate", then a durable sleep: the run after the sleep
    must meet the same outcome of the wait, whatever signal came meanwhile."""
    try:
        ctx.wait_for_signal("approve", timeout=params.timeout)
        branch = "approved"
    except SignalTimeout:
        branch = "escalated"
    ctx.sleep(params.then_sleep)
    return {"branch": branch}


class AddParams(Params):
    n: int = 0


@job_kind("test.add", org_states={"active"}, max_attempts=2, backoff=0.2)
def add(ctx: JobContext, params: AddParams) -> int:
    """A workflow step: its inputs (the results of the steps it waited for) plus n."""
    return sum(value for value in ctx.inputs if isinstance(value, int)) + params.n


@job_kind("test.collect", org_states={"active", "read_only"}, max_attempts=2, backoff=0.2)
def collect(ctx: JobContext, params: NoParams) -> list[Any]:
    """A chord's callback: the results it waited for, in order."""
    return list(ctx.inputs)


class Boom(DomainError):
    code = "boom"
    message = "This step always fails."


@job_kind("test.boom", org_states={"active", "read_only"}, max_attempts=1)
def boom(ctx: JobContext, params: NoParams) -> None:
    raise Boom()


class KilledMidStepParams(Params):
    project: Annotated[str, Field(min_length=1, max_length=100)]
    #: how long the first attempt's second step takes, WITHOUT checkpoints (a worker is killed
    #: in it); later attempts take no time
    seconds: Annotated[float, Field(ge=0, le=60)] = 30


@job_kind("test.killed_mid_step", org_states={"active"}, max_attempts=3, backoff=0.2,
          lease=timedelta(seconds=2), params=KilledMidStepParams)
def killed_mid_step(ctx: JobContext, params: KilledMidStepParams) -> dict[str, Any]:
    """Two steps: the first with a visible effect (a project), the second slow on the first
    attempt. A worker killed in the second: the next attempt must not redo the first."""

    def create() -> str:
        with ctx.tenant() as tenant:
            return str(Projects.of(tenant).create(params.project, "made by step one").id)

    def slow() -> int:
        if ctx.job.attempt == 1:
            time.sleep(params.seconds)
        return ctx.job.attempt

    made = ctx.step("one", create)
    two_ran_in = ctx.step("two", slow)
    return {"project_id": made, "two_ran_in_attempt": two_ran_in, "attempt": ctx.job.attempt}


@job_kind("test.fails_once", org_states={"active"}, max_attempts=3, backoff=0.2)
def fails_once(ctx: JobContext, params: NoParams) -> dict[str, Any]:
    """A workflow step whose first attempt fails with a retryable error: the step is retried
    on its own, the workflow is not."""
    if ctx.job.attempt == 1:
        raise RuntimeError("the first attempt fails")
    return {"attempt": ctx.job.attempt, "inputs": list(ctx.inputs)}


class TracedParams(Params):
    #: a tenant's text: it must never appear in a span
    note: Annotated[str, Field(min_length=1, max_length=200)]


@job_kind("test.traced", org_states={"active"}, max_attempts=3, backoff=0.2,
          params=TracedParams)
def traced(ctx: JobContext, params: TracedParams) -> dict[str, Any]:
    """A step, a durable sleep, then a first attempt that fails with the tenant's text in its
    message (retried), and a second that completes: every span a job can make, in one trace."""
    length = ctx.step("measure the note", lambda: len(params.note))
    ctx.sleep(0.3)
    if ctx.job.attempt == 1:
        raise RuntimeError(f"the first attempt fails on {params.note}")
    return {"length": length, "note": params.note}


@job_kind("test.rated", org_states={"active"}, rate_limit="3 per 2 seconds")
def rated(ctx: JobContext, params: NoParams) -> dict[str, Any]:
    """A kind that declares a rate limit: at most 3 start in any 2 s in one organization."""
    return {"attempt": ctx.job.attempt}


class BlobParams(Params):
    kib: Annotated[int, Field(ge=1, le=256)]


@job_kind("test.blob", org_states={"active"}, max_attempts=2, backoff=0.2, params=BlobParams)
def blob(ctx: JobContext, params: BlobParams) -> dict[str, Any]:
    """A workflow step with a large result: ``kib`` KiB of its own, and how many bytes of
    inputs it read (a chain of these must not copy every result into every later step)."""
    read = sum(len(value.get("blob", "")) for value in ctx.inputs if isinstance(value, dict))
    return {"blob": "x" * (params.kib * 1024), "read": read}


class ApprovalParams(Params):
    timeout: Annotated[float, Field(gt=0, le=3600)] = 60


@job_kind("test.approval", org_states={"active", "read_only"}, max_attempts=3, backoff=0.2,
          params=ApprovalParams)
def approval(ctx: JobContext, params: ApprovalParams) -> dict[str, Any]:
    """Waits for an approval and answers who the database says sent it, beside what the
    payload claims: an approval must trust the first, never the second."""
    signal = ctx.receive_signal("approve", timeout=params.timeout)
    return {"payload": signal.payload, "sent_by": str(signal.sent_by),
            "sender_role": signal.sender_role}


@job_kind("test.admin_approval", org_states={"active"}, role="admin", max_attempts=3,
          backoff=0.2, params=ApprovalParams)
def admin_approval(ctx: JobContext, params: ApprovalParams) -> dict[str, Any]:
    """An approval only its requester or an admin may send (its kind's role): the signal's
    sender, as the database names them, is its result."""
    signal = ctx.receive_signal("approve", timeout=params.timeout)
    return {"payload": signal.payload, "sender_role": signal.sender_role}


@job_kind("test.admin_step", org_states={"active"}, role="admin", max_attempts=2, backoff=0.2)
def admin_step(ctx: JobContext, params: NoParams) -> dict[str, Any]:
    """A step only admins may start, whose result only admins may read (its kind's role)."""
    return {"for": "admins only"}


class EchoAnyParams(Params):
    #: free-form, as a kind's ``dict[str, Any]`` field: any JSON the caller sends
    data: Any = None


@job_kind("test.echo", org_states={"active"}, max_attempts=2, backoff=0.2, params=EchoAnyParams)
def echo(ctx: JobContext, params: EchoAnyParams) -> dict[str, Any]:
    """Completes with its params as they came (a value at the depth limit comes back whole)."""
    return {"data": params.data}


class NestedParams(Params):
    depth: Annotated[int, Field(ge=1, le=100_000)]
    #: where the nested value goes: the job's result, or the value of a step
    into: Literal["result", "step"] = "result"


@job_kind("test.nested", org_states={"active"}, max_attempts=3, backoff=0.2, params=NestedParams)
def nested(ctx: JobContext, params: NestedParams) -> Any:
    """Makes lists nested ``depth`` levels deep (``[[…[]…]]``) and returns them or records them
    as a step: what a kind may write, against the depth limit (models/json_limits.py)."""
    value: list[Any] = []
    for _ in range(params.depth - 1):
        value = [value]
    if params.into == "step":
        ctx.step("nested", lambda: value)
        return {}
    return value


class NotYet(DomainError):
    code = "not_yet"
    message = "Not yet: try again later."
    permanent = False


class RetryLaterParams(Params):
    #: the first attempt fails with a bug (an unexpected exception), not a transient error
    bug: bool = False


@job_kind("test.retry_later", org_states={"active"}, max_attempts=3, backoff=600, backoff_max=600)
def retry_later(ctx: JobContext, params: RetryLaterParams) -> dict[str, Any]:
    """Fails its first attempt with a transient error (or a bug) and a backoff of five to ten
    minutes, then completes: a retry that is due only once time has moved (spacejobs.testing)."""
    if ctx.job.attempt == 1:
        if params.bug:
            raise RuntimeError("a bug on the first attempt")
        raise NotYet()
    return {"attempt": ctx.job.attempt}


class ImageTooLarge(DomainError):
    """A kind's own failure: permanent, its sentence says what is wrong with the input."""

    code = "image_too_large"
    message = "The image is larger than 10,000 pixels on a side."


@job_kind("test.image_too_large", org_states={"active"}, max_attempts=3, backoff=0.2)
def image_too_large(ctx: JobContext, params: NoParams) -> dict[str, Any]:
    raise ImageTooLarge()


class GateParams(Params):
    #: a file whose presence opens the gate (the test creates it between a failure and a resume)
    path: Annotated[str, Field(min_length=1, max_length=500)]


class GateClosed(DomainError):
    code = "gate_closed"
    message = "The gate is closed."


@job_kind("test.gate", org_states={"active"}, max_attempts=1, params=GateParams)
def gate(ctx: JobContext, params: GateParams) -> dict[str, Any]:
    """A workflow step that fails for good until its file exists, then passes its inputs on:
    what a resumed workflow runs again."""
    if not os.path.exists(params.path):
        raise GateClosed()
    return {"inputs": list(ctx.inputs)}


class OnFailureParams(Params):
    note: Annotated[str, Field(min_length=1, max_length=100)]


@job_kind("test.on_failure", org_states={"active"}, max_attempts=2, backoff=0.2,
          params=OnFailureParams)
def on_failure(ctx: JobContext, params: OnFailureParams) -> dict[str, Any]:
    """A workflow's failure handler: its result is what it was told."""
    return {"note": params.note, "failure": ctx.inputs[0], "inputs": len(ctx.inputs)}
