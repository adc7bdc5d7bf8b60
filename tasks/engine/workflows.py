"""A workflow's run, in the worker: the run of a submitted workflow's job (kind ``workflow``) and
of a kind's own ``ctx.workflow``. The database runs the steps (models/db/schema/70_fan_out.sql);
this records them on the first run, waits without a worker, and collects once it is settled.
The canvas itself, what a submitter writes, is spacejobs.models.jobs.canvas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from spacejobs.models.errors import CancelRequested, DomainError, InvalidRequest, LeaseLost, WaitRequested
from spacejobs.models.jobs.canvas import (
    MAX_STEPS_IN_KIND,
    Canvas,
    FailureHandler,
    Policy,
    StepNode,
    check_steps,
    compile_canvas,
)
from spacejobs.models.jobs.records import ACTIVE, Status
from spacejobs.models.jobs.store import StepPlan, WorkflowState
from spacejobs.models.kinds import get_any_kind

if TYPE_CHECKING:
    from spacejobs.models.jobs.store import Child
    from spacejobs.tasks.engine.context import JobContext


class StepsFailed(DomainError):
    code = "steps_failed"
    message = "Some steps of the workflow did not complete."


def run_canvas(ctx: JobContext, canvas: Canvas, *, policy: Policy = "fail_fast",
               max_parallel: int | None = None) -> dict[str, Any]:
    """A kind's own workflow (``ctx.workflow``): its steps, run as the job's children. Unlike a
    submitted workflow, its steps may be child-only kinds (the kind's author composes them, as
    for a fan-out). The compiled steps are recorded as a step on the first run, so every later
    run follows the same graph."""

    def compiled() -> list[dict[str, Any]]:
        nodes = compile_canvas(canvas)
        if not 1 <= len(nodes) <= MAX_STEPS_IN_KIND:
            raise InvalidRequest(f"A kind's workflow holds 1 to {MAX_STEPS_IN_KIND} steps.",
                                 fields=["steps"])
        check_steps(nodes, get_any_kind)
        return [node.as_params() for node in nodes]

    # Compiled and checked once, on the first run; later runs read the graph it recorded.
    recorded = ctx.step(ctx.next_step_name("workflow"), compiled)
    return run_workflow(ctx, [StepNode.model_validate(node) for node in recorded], policy,
                        max_parallel=max_parallel)


def run_workflow(ctx: JobContext, steps: Sequence[StepNode], policy: Policy, *,
                 max_parallel: int | None = None,
                 on_failure: FailureHandler | None = None) -> dict[str, Any]:
    """A workflow's run. The database runs the workflow (models/db/schema/70_fan_out.sql): the
    first run records the steps and makes those ready at once (at most ``max_parallel``
    unfinished, when given), then waits without a worker; each step's end makes the steps it
    let go, in the transaction that ends it; the workflow runs again once settled (nothing
    unfinished, or a failed step under fail_fast) to collect. A workflow that fails makes its
    failure handler (``on_failure``) first, once; one that is cancelled does not."""
    try:
        ctx.checkpoint()
        state = ctx.runtime.workflow_state(ctx.job)
        if state is None:
            state = _start(ctx, steps, policy, max_parallel)
        settled = state.active == 0 or (state.failed > 0 and policy == "fail_fast")
        if not settled:
            ctx.progress("steps", done=state.ended, total=len(steps))
            raise WaitRequested(children=state.active)  # the database resumes it when settled
        children = {child.index: child for child in ctx.runtime.children(ctx.job)}
        failed = [i for i, c in children.items() if c.status not in ACTIVE
                  and c.status != Status.COMPLETED]
        if failed and policy == "fail_fast":
            ctx.runtime.cancel_children(ctx.job)
            raise _handled(ctx, on_failure, steps, children, failed, skipped=[])
        ctx.progress("steps", done=state.ended, total=len(steps))
    except CancelRequested:
        ctx.runtime.cancel_children(ctx.job)
        raise
    skipped = [i for i in range(len(steps)) if i not in children]
    failed = [i for i, c in children.items() if c.status != Status.COMPLETED]
    if failed or skipped:
        raise _handled(ctx, on_failure, steps, children, sorted(failed), skipped)
    last = [i for i in range(len(steps)) if not any(i in s.needs for s in steps)]
    results = {steps[i].name: children[i].result for i in range(len(steps))}
    return {"steps": results, "result": children[last[0]].result if len(last) == 1
            else [children[i].result for i in last]}


def _start(ctx: JobContext, steps: Sequence[StepNode], policy: Policy,
           max_parallel: int | None) -> WorkflowState:
    plan = [StepPlan(get_any_kind(step.kind).rules, step.params, step.after, step.waits)
            for step in steps]
    state = ctx.runtime.start_workflow(ctx.job, plan, policy, max_parallel)
    if state is None:
        ctx.check_lease_now()  # a cancel asked for meanwhile, or the lease lost
        raise LeaseLost()
    return state


def _handled(ctx: JobContext, on_failure: FailureHandler | None, steps: Sequence[StepNode],
             children: Mapping[int, Child], failed: Sequence[int],
             skipped: Sequence[int]) -> StepsFailed:
    """The workflow's failure, after its failure handler was made (once: a later attempt that
    fails again finds it made). Its first input is what failed: each failed and skipped step's
    place, name, kind, status and error code, never a result nor a message (a step's result may
    need a role the requester lacks; a message is for operators), and the workflow's own id."""
    if on_failure is not None:
        failure = {
            "workflow_id": str(ctx.job.id),
            "failed": [{"place": i, "name": steps[i].name, "kind": steps[i].kind,
                        "status": str(children[i].status), "error_code": children[i].error_code}
                       for i in failed],
            # every step never made, whichever the policy (fail_fast's message lists none)
            "skipped": [{"place": i, "name": steps[i].name, "kind": steps[i].kind}
                        for i in range(len(steps)) if i not in children],
        }
        made = ctx.runtime.start_failure_handler(ctx.job, failure,
                                                 get_any_kind(on_failure.kind).rules)
        if made is None:
            ctx.check_lease_now()
            raise LeaseLost()
    return _failed(steps, children, failed, skipped)


def _failed(steps: Sequence[StepNode], children: Mapping[int, Child], failed: Sequence[int],
            skipped: Sequence[int]) -> StepsFailed:
    """The workflow's failure. Its message is the job's ``error_message``, which operators read
    too (/ops): it names each step by its place (1-based) and kind, with its status and error
    code, never by its name, which a member gives and is part of the params operators never
    see; nor does it quote a step's own message. The names stay where members read them (the
    job's steps on its page). Its details name the steps by place too (0-based, as the
    submit's refusal of a step does): the runner stores no details, but nothing of the error
    should carry the names should that change."""
    parts = [f"step {i + 1} {steps[i].kind} {children[i].status}"
             + (f" ({children[i].error_code})" if children[i].error_code else "") for i in failed]
    parts += [f"step {i + 1} {steps[i].kind} skipped" for i in skipped]
    return StepsFailed(f"{len(failed)} of {len(steps)} steps did not complete"
                       + (f", {len(skipped)} skipped" if skipped else "") + ": " + "; ".join(parts),
                       failed=list(failed), skipped=list(skipped))
