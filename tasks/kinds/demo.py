"""A kind slow enough to watch, registered with SPACEJOBS_DEMO_KINDS=1 (``spacejobs demo`` sets
it): the projects export, lingering over each project so the live job page visibly moves and a
person has time to press Cancel."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from pydantic import Field

from spacejobs.models.jobs.context import JobContext
from spacejobs.models.kinds import Params, job_kind
from spacejobs.tasks.kinds.projects import export


class SlowExportParams(Params):
    seconds: Annotated[float, Field(ge=1, le=600)] = 20.0


@job_kind(
    "demo.slow_export",
    org_states={"active", "read_only"},
    role="member",
    max_attempts=3,
    lease=timedelta(seconds=30),
    params=SlowExportParams,
)
def slow_export(ctx: JobContext, params: SlowExportParams) -> dict[str, Any]:
    return export(ctx, linger_seconds=params.seconds)
