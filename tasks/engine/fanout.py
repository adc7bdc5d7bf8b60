"""Durable fan-out: a parent job runs one child job per item and collects their results in
input order.

The database runs it (models/db/schema/70_fan_out.sql). The parent's first run records the
items and the first ``max_parallel`` children in one fenced transaction (start_fan_out()), then
waits WITHOUT a worker: it ends its run as ``waiting``. From then on each child's end makes the
next child, in the transaction that ends it (the jobs trigger), so at most ``max_parallel`` are
unfinished at a time and no round trip through the parent stands between one child and the
next. Once the last has ended the trigger puts the parent back in the queue (the sweeper is the
floor), and its second run reads the children, once: their results in input order, or a
failure listing every failed child. So a parent runs twice, however many children it has.

A later run finds the fan-out started and never starts another (the first run's items are the
ones fanned out), so a parent whose worker dies is claimed again and carries on without
duplicating a child. A cancelled parent cancels its children, and nothing more is released
under it. One fan-out per job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from spacejobs.models.errors import CancelRequested, DomainError, LeaseLost, WaitRequested
from spacejobs.models.jobs.records import Status
from spacejobs.models.json_limits import check_params
from spacejobs.models.kinds import get_any_kind

if TYPE_CHECKING:
    from spacejobs.models.jobs.store import FanOut
    from spacejobs.models.kinds.rules import KindRules
    from spacejobs.tasks.engine.context import JobContext

class ChildrenFailed(DomainError):
    code = "children_failed"
    message = "Some parts of the job failed."


def fan_out(ctx: JobContext, kind: str, items: Sequence[dict[str, Any]], *,
            max_parallel: int = 4) -> list[Any]:
    """Run ``kind`` once per item (its params), at most ``max_parallel`` at a time, and return
    the results in the order of ``items``. Raises ChildrenFailed, once every child has ended, if
    any did not complete; on a cancel, cancels the children first."""
    # The one way to create jobs of a child-only kind (every submit refuses them).
    child_kind = get_any_kind(kind)
    try:
        ctx.checkpoint()  # never start after a cancel was asked for
        state = ctx.runtime.fan_out_state(ctx.job)
        if state is None:
            for item in items:
                check_params(item)  # a child's params, as any job's (models/json_limits.py)
                child_kind.parse_params(item)  # a bad item fails the parent now, not n children later
            state = _start(ctx, child_kind.rules, items, max(1, max_parallel))
        if not state.done:
            ctx.progress("children", done=state.ended, total=state.total)
            # Resumed when none is left active: the database releases the rest meanwhile.
            raise WaitRequested(children=1)
        children = ctx.runtime.children(ctx.job)
    except CancelRequested:
        ctx.runtime.cancel_children(ctx.job)
        raise
    ctx.progress("children", done=state.ended, total=state.total)
    failed = [child for child in children if child.status != Status.COMPLETED]
    if failed:
        # Each part by its place, status and error code, never its own message: the parent's
        # message is its error_message, which operators read too, and a part's message is its
        # kind's sentence, which may quote what the part was given (a kind's own workflow named
        # its steps, the params refused: models.kinds.reasons names their fields). The part's
        # page and row keep its message.
        raise ChildrenFailed(
            f"{len(failed)} of {state.total} parts did not complete: " + "; ".join(
                f"#{child.index + 1} {child.status}"
                + (f" ({child.error_code})" if child.error_code else "") for child in failed),
            failed=[child.index for child in failed])
    return [child.result for child in children]


def _start(ctx: JobContext, rules: KindRules, items: Sequence[dict[str, Any]], max_parallel: int
           ) -> FanOut:
    state = ctx.runtime.start_fan_out(ctx.job, rules, [dict(item) for item in items], max_parallel)
    if state is None:
        ctx.check_lease_now()  # a cancel asked for meanwhile, or the lease lost
        raise LeaseLost()
    return state
