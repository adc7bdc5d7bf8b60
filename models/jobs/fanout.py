"""Durable fan-out: a parent job runs one child job per item and collects their results in
input order.

Everything lives in the rows: a parent spawns children (places 0..n-1, each at most once, see
spawn_children() in the schema), at most ``max_parallel`` of them unfinished at a time, and
waits for them WITHOUT a worker: it ends its run as ``waiting``, and a child's end puts it back
in the queue (the jobs trigger; the sweeper is the floor). Each run of the parent finds the
children made so far and carries on: spawns the next ones, waits again, or collects. The items
are recorded as a step on the first run, so every later run fans out the same ones. A parent
whose worker dies is claimed again and carries on the same way. When every child
has ended, it returns their results in input order, or fails listing every failed child. A
cancelled parent cancels its children before it stops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from models.errors import CancelRequested, DomainError, WaitRequested
from models.jobs.records import ACTIVE, Status
from models.kinds import get_any_kind

if TYPE_CHECKING:
    from models.jobs.context import JobContext

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
    rules = child_kind.rules
    for item in items:
        child_kind.parse_params(item)  # a bad item fails the parent now, not n children later
    items = ctx.step(ctx.next_step_name(f"fan_out:{kind}"), lambda: [dict(item) for item in items])
    total = len(items)
    try:
        while True:
            ctx.checkpoint()  # never spawn after a cancel was asked for
            children = {child.index: child for child in ctx.runtime.children(ctx.job)}
            unfinished = sum(child.status in ACTIVE for child in children.values())
            waiting = [place for place in range(total) if place not in children]
            room = max(0, max_parallel - unfinished)
            if waiting and room:
                ctx.runtime.spawn_children(ctx.job, rules,
                                           [(place, dict(items[place])) for place in waiting[:room]])
                continue
            done = sum(child.status not in ACTIVE for child in children.values())
            ctx.progress("children", done=done, total=total)
            if not waiting and done == total:
                break
            raise WaitRequested(children=unfinished)  # resumed when one of them ends
    except CancelRequested:
        ctx.runtime.cancel_children(ctx.job)
        raise
    ordered = [children[place] for place in range(total)]
    failed = [child for child in ordered if child.status != Status.COMPLETED]
    if failed:
        raise ChildrenFailed(
            f"{len(failed)} of {total} parts did not complete: " + "; ".join(
                f"#{child.index + 1} {child.status}"
                + (f" ({child.error_code}: {child.error_message})" if child.error_code else "")
                for child in failed),
            failed=[child.index for child in failed])
    return [child.result for child in ordered]
