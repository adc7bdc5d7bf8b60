"""The kinds only ``bench.waiting`` runs, loaded into its processes through
SPACEJOBS_EXTRA_KIND_MODULES (as the test stacks load tests.kinds).

``bench_waiting.until`` waits for a moment the benchmark chose, so that 200 timers can be due in
the same instant or spread evenly over a minute, whenever their first runs happened.
``bench_waiting.fan`` fans out ``bench.noop`` children: the fan-out's drain then compares with a
plain drain of the same kind; with ``child_seconds`` its children are ``bench.sleep`` (the cancel
figure's running grandchild).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AwareDatetime, Field

from spacejobs.models.kinds import Params, job_kind
from spacejobs.tasks.engine.context import JobContext

CHILD_KIND = "bench.noop"
SLEEP_KIND = "bench.sleep"


class UntilParams(Params):
    at: AwareDatetime


@job_kind("bench_waiting.until", org_states={"active"}, max_attempts=3, backoff=0.5,
          params=UntilParams)
def until(ctx: JobContext, params: UntilParams) -> dict[str, Any]:
    """Waits durably (no worker held) until ``at``, then completes."""
    moment: datetime = params.at
    ctx.sleep_until(moment)
    return {}


class FanParams(Params):
    children: Annotated[int, Field(ge=1, le=10_000)]
    max_parallel: Annotated[int, Field(ge=1, le=1000)] = 50
    #: 0: bench.noop children; more: bench.sleep children of that many seconds each
    child_seconds: Annotated[float, Field(ge=0, le=60)] = 0


@job_kind("bench_waiting.fan", org_states={"active"}, max_attempts=3, backoff=0.5,
          params=FanParams)
def fan(ctx: JobContext, params: FanParams) -> dict[str, Any]:
    """``children`` bench.noop (or bench.sleep) jobs, at most ``max_parallel`` unfinished at a
    time; the parent waits for them without a slot."""
    kind, item = ((SLEEP_KIND, {"seconds": params.child_seconds}) if params.child_seconds
                  else (CHILD_KIND, {}))
    results = ctx.fan_out(kind, [item] * params.children, max_parallel=params.max_parallel)
    return {"children": len(results)}
