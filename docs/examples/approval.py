"""A kind that waits without holding a worker: it prepares a report once, waits for a person's
approval (a signal), then waits a moment before it publishes. Between its steps and waits it
does only what gives the same answer every time, so every run reaches them in the same order.

Load it like any kind: SPACEJOBS_EXTRA_KIND_MODULES=approval (with this folder importable).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from spacejobs import JobContext, Params, job_kind
from spacejobs.demo.projects import Projects


class ApprovalParams(Params):
    title: Annotated[str, Field(min_length=1, max_length=100)]
    approve_within: Annotated[float, Field(ge=1, le=86400)] = 3600
    publish_after: Annotated[float, Field(ge=0, le=3600)] = 1


@job_kind("approval", org_states={"active"}, role="member")
def approval(ctx: JobContext, params: ApprovalParams) -> dict[str, Any]:
    def prepare() -> dict[str, Any]:
        # Done once for the job: a later run (after each wait) gets this back from its record.
        with ctx.tenant() as tenant:
            return {"title": params.title, "projects": len(Projects.of(tenant).list())}

    draft = ctx.step("prepare the draft", prepare)
    # Holds no worker while it waits; SignalTimeout (signal_timeout) if nobody answers in time.
    # An approval counts from an admin or an owner. Who sent a signal, and the role they held,
    # are the database's to say (never a field of the payload, which the sender writes); a
    # member's signal is taken and passed over, and the job waits for the next.
    decision = ctx.receive_signal("approved", timeout=params.approve_within)
    while decision.sender_role not in ("admin", "owner"):
        decision = ctx.receive_signal("approved", timeout=params.approve_within)
    ctx.sleep(params.publish_after)  # a durable timer: the sweeper puts the job back when due
    return {"draft": draft, "approved_by": str(decision.sent_by), "published": True}
