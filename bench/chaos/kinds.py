"""The one kind only ``bench.chaos`` runs, loaded into its processes through
SPACEJOBS_EXTRA_KIND_MODULES (as the test stacks load tests.kinds).

``chaos.fan`` is a fan-out parent of ``bench.sleep`` children that first draws a random number
in a step: the step rule says the draw is made once for the job, so whatever run of the parent
returns (after kills, waits and lease takeovers) must carry the value recorded in ``job_steps``,
which the run's invariants compare.
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any

from pydantic import Field

from spacejobs.models.kinds import Params, job_kind
from spacejobs.tasks.engine.context import JobContext

CHILD_KIND = "bench.sleep"
DRAW_STEP = "draw"


class FanParams(Params):
    seconds: Annotated[list[Annotated[float, Field(ge=0, le=60)]], Field(min_length=1, max_length=100)]
    max_parallel: Annotated[int, Field(ge=1, le=100)] = 2


@job_kind("chaos.fan", org_states={"active", "read_only"}, max_attempts=10, backoff=0.5,
          params=FanParams)
def fan(ctx: JobContext, params: FanParams) -> dict[str, Any]:
    """One ``bench.sleep`` child per entry of ``seconds``, ``max_parallel`` at a time; returns
    the draw and the children's results in order."""
    draw = ctx.step(DRAW_STEP, lambda: secrets.token_hex(8))
    children = ctx.fan_out(CHILD_KIND, [{"seconds": s} for s in params.seconds],
                           max_parallel=params.max_parallel)
    return {"draw": draw, "children": children}
