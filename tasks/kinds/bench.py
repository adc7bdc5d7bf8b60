"""Kinds for benchmarks and fault tests, registered only with SPACEJOBS_BENCH_KINDS=1."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Annotated, Any

from pydantic import Field

from spacejobs.models.kinds import NoParams, Params, job_kind
from spacejobs.tasks.engine.context import JobContext


@job_kind("bench.noop", org_states={"active", "read_only"}, max_attempts=3, backoff=0.5)
def noop(ctx: JobContext, params: NoParams) -> dict[str, Any]:
    return {}


class SleepParams(Params):
    seconds: Annotated[float, Field(ge=0, le=60)] = 1.0


@job_kind(
    "bench.sleep",
    org_states={"active", "read_only"},
    max_attempts=5,
    backoff=0.5,
    backoff_max=5,
    lease=timedelta(seconds=10),
    params=SleepParams,
)
def sleep(ctx: JobContext, params: SleepParams) -> dict[str, Any]:
    # Sleep in short steps so cancellation and a lost lease stop the job promptly.
    deadline = time.monotonic() + params.seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))
        ctx.checkpoint()
    return {"slept": params.seconds}


class WaitParams(Params):
    seconds: Annotated[float, Field(ge=0, le=3600)] = 1.0


@job_kind("bench.wait", org_states={"active", "read_only"}, max_attempts=3, backoff=0.5,
          params=WaitParams)
def wait(ctx: JobContext, params: WaitParams) -> dict[str, Any]:
    """Waits durably on a timer (no worker held meanwhile), then completes."""
    ctx.sleep(params.seconds)
    return {"waited": params.seconds}


class AwaitSignalParams(Params):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    timeout: Annotated[float, Field(ge=0, le=86400)] = 60.0


@job_kind("bench.await_signal", org_states={"active", "read_only"}, max_attempts=3, backoff=0.5,
          params=AwaitSignalParams)
def await_signal(ctx: JobContext, params: AwaitSignalParams) -> dict[str, Any]:
    """Waits durably for the signal ``name`` and completes with its payload; fails
    ``signal_timeout`` when none came in ``timeout`` seconds."""
    return {"signal": params.name, "payload": ctx.wait_for_signal(params.name, timeout=params.timeout)}
