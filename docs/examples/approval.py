"""A kind that waits without holding a worker: it prepares a report once, waits for a person's
approval (a signal), then waits a moment before it publishes. Between its steps and waits it
does only what gives the same answer every time, so every run reaches them in the same order.

Load it like any kind: SPACEJOBS_EXTRA_KIND_MODULES=approval (with this folder importable).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from models.jobs.context import JobContext
from models.kinds import Params, job_kind


class ApprovalParams(Params):
    title: Annotated[str, Field(min_length=1, max_length=100)]
    approve_within: Annotated[float, Field(ge=1, le=86400)] = 3600
    publish_after: Annotated[float, Field(ge=0, le=3600)] = 1


@job_kind("approval", org_states={"active"}, role="member")
def approval(ctx: JobContext, params: ApprovalParams) -> dict[str, Any]:
    def prepare() -> dict[str, Any]:
        # Done once for the job: a later run (after each wait) gets this back from its record.
        with ctx.tenant() as tenant:
            return {"title": params.title, "projects": len(tenant.projects.list())}

    draft = ctx.step("prepare the draft", prepare)
    # Holds no worker while it waits; SignalTimeout (signal_timeout) if nobody answers in time.
    decision = ctx.wait_for_signal("approved", timeout=params.approve_within)
    ctx.sleep(params.publish_after)  # a durable timer: the sweeper puts the job back when due
    return {"draft": draft, "approved_by": decision.get("by"), "published": True}
