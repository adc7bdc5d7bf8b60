"""A workflow's last run and its failure handler (spacejobs.tasks.engine.workflows), through a
fake of the database side: the handler is asked for once the workflow fails, with what failed
(places, names, kinds, statuses, error codes, never a result), and not when it completes, when
it is cancelled, or when it declared none."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from spacejobs.models.errors import CancelRequested, LeaseLost
from spacejobs.models.jobs.canvas import FailureHandler, StepNode
from spacejobs.models.jobs.records import Status
from spacejobs.models.jobs.store import Child, WorkflowState
from spacejobs.models.kinds import load_kinds
from spacejobs.tasks.engine.workflows import StepsFailed, run_workflow

load_kinds(["spacejobs.tasks.kinds.bench", "spacejobs.tasks.kinds.workflow"])

STEPS = [StepNode(name="one", kind="bench.noop"), StepNode(name="two", kind="bench.noop", after=[0]),
         StepNode(name="three", kind="bench.noop", after=[1])]
HANDLER = FailureHandler(kind="bench.sleep", params={"seconds": 1})


class FakeRuntime:
    def __init__(self, children: list[Child], *, made: bool = True) -> None:
        self._children = children
        self.made = made
        self.handlers: list[tuple[dict[str, Any], str]] = []
        self.cancelled = 0

    def workflow_state(self, job: Any) -> WorkflowState:
        ended = sum(c.status not in (Status.QUEUED, Status.LEASED) for c in self._children)
        failed = sum(c.status in (Status.FAILED, Status.CANCELLED) for c in self._children)
        return WorkflowState(len(STEPS), len(self._children), ended, failed)

    def children(self, job: Any) -> list[Child]:
        return self._children

    def cancel_children(self, job: Any) -> int:
        self.cancelled += 1
        return 0

    def start_failure_handler(self, job: Any, failure: dict[str, Any], handler: Any) -> Any:
        self.handlers.append((failure, handler.name))
        return uuid.uuid4() if self.made else None


class FakeContext:
    def __init__(self, runtime: FakeRuntime, *, cancelled: bool = False) -> None:
        self.runtime = runtime
        self.job = type("Job", (), {"id": uuid.uuid4()})()
        self.cancelled = cancelled

    def checkpoint(self) -> None:
        if self.cancelled:
            raise CancelRequested()

    def progress(self, *args: Any, **kwargs: Any) -> None:
        pass

    def check_lease_now(self) -> None:
        pass


def child(place: int, status: Status, error_code: str | None = None, result: Any = None) -> Child:
    return Child(place, uuid.uuid4(), status, result, error_code, None)


def test_a_failed_workflow_asks_for_its_handler_with_what_failed_and_no_result():
    runtime = FakeRuntime([child(0, Status.COMPLETED, result={"secret": "result"}),
                           child(1, Status.FAILED, "boom")])
    ctx = FakeContext(runtime)
    with pytest.raises(StepsFailed):
        run_workflow(ctx, STEPS, "fail_fast", on_failure=HANDLER)  # type: ignore[arg-type]
    assert runtime.handlers == [({
        "workflow_id": str(ctx.job.id),
        "failed": [{"place": 1, "name": "two", "kind": "bench.noop", "status": "failed",
                    "error_code": "boom"}],
        "skipped": [{"place": 2, "name": "three", "kind": "bench.noop"}]}, "bench.sleep")]
    assert "secret" not in repr(runtime.handlers)


def test_under_run_all_the_handler_is_asked_for_at_the_end():
    runtime = FakeRuntime([child(0, Status.FAILED, "boom")])
    with pytest.raises(StepsFailed):
        run_workflow(FakeContext(runtime), STEPS, "run_all", on_failure=HANDLER)  # type: ignore[arg-type]
    assert [failure["failed"][0]["place"] for failure, _ in runtime.handlers] == [0]


def test_no_handler_when_it_completes_is_cancelled_or_declared_none():
    done = FakeRuntime([child(i, Status.COMPLETED, result=i) for i in range(3)])
    assert run_workflow(FakeContext(done), STEPS, "fail_fast",  # type: ignore[arg-type]
                        on_failure=HANDLER)["result"] == 2
    cancelled = FakeRuntime([child(0, Status.COMPLETED)])
    with pytest.raises(CancelRequested):
        run_workflow(FakeContext(cancelled, cancelled=True), STEPS, "fail_fast",  # type: ignore[arg-type]
                     on_failure=HANDLER)
    none = FakeRuntime([child(0, Status.FAILED, "boom")])
    with pytest.raises(StepsFailed):
        run_workflow(FakeContext(none), STEPS, "fail_fast")  # type: ignore[arg-type]
    assert done.handlers == cancelled.handlers == none.handlers == []


def test_a_workflow_whose_lease_is_gone_does_not_fail_without_its_handler():
    runtime = FakeRuntime([child(0, Status.FAILED, "boom")], made=False)
    with pytest.raises(LeaseLost):
        run_workflow(FakeContext(runtime), STEPS, "fail_fast", on_failure=HANDLER)  # type: ignore[arg-type]
