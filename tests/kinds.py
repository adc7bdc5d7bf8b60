"""Job kinds that exist only for tests (loaded through SPACEJOBS_EXTRA_KIND_MODULES)."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Annotated, Any

from pydantic import Field

from models.jobs.context import JobContext
from models.kinds import NoParams, Params, job_kind

# Planted in exceptions: it must never reach error_message, an HTTP body or a user.
SECRET_MARKER = "SECRET-7f3a postgresql://space:hunter2@db.internal/tenants"


@job_kind("test.fail", org_states={"active"}, max_attempts=3, backoff=0.4, backoff_max=2)
def always_fails(ctx: JobContext, params: NoParams) -> dict[str, Any]:
    with ctx.tenant() as tenant:
        tenant.projects.list()
    raise RuntimeError(f"boom: {SECRET_MARKER}")


class StallParams(Params):
    seconds: Annotated[float, Field(ge=0, le=30)] = 0


@job_kind("test.stall", org_states={"active"}, max_attempts=3, backoff=0.2,
          lease=timedelta(seconds=2), params=StallParams)
def stall(ctx: JobContext, params: StallParams) -> dict[str, Any]:
    """Sleeps WITHOUT checkpoints, then returns who ran it: a late finisher, on purpose."""
    time.sleep(params.seconds)
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


@job_kind("test.capped", org_states={"active"}, quota=2)
def capped(ctx: JobContext, params: NoParams) -> dict[str, Any]:
    """A kind that declares its own quota: at most 2 active per organization."""
    return {}
