"""A parent's fan-out (models/jobs/fanout.py) over a fake of the database's side
(70_fan_out.sql): the first run records the items and the first max_parallel children, each
child's end releases the next, and the parent, resumed once the last has ended, collects.
Results in input order, never more than max_parallel unfinished, the parent run twice, every
failed part listed, a cancel passed on to the children, and a later run carrying on with the
fan-out the first one started."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from spacejobs.models.errors import CancelRequested, InvalidParams, LeaseLost, WaitRequested
from spacejobs.models.jobs.records import ACTIVE, Status
from spacejobs.models.jobs.store import FanOut
from spacejobs.models.kinds import load_kinds
from spacejobs.tasks.engine.fanout import ChildrenFailed, fan_out

load_kinds()
PART = "projects_report.project"


@dataclass
class Child:
    index: int
    status: Status
    result: Any = None
    error_code: str | None = None
    error_message: str | None = None


class FakeRuntime:
    """The fan-out's rows and what the jobs trigger does with them, in miniature."""

    def __init__(self, failing: set[int] = frozenset()) -> None:
        self.children_of: dict[int, Child] = {}
        self.items: list[dict[str, Any]] | None = None
        self.max_parallel = 0
        self.failing = failing
        self.peak = 0
        self.spawned: list[int] = []
        self.cancelled = False
        self.holds = True  # the parent's lease is the caller's

    def state(self) -> FanOut | None:
        if self.items is None:
            return None
        ended = sum(c.status not in ACTIVE for c in self.children_of.values())
        return FanOut(len(self.items), len(self.children_of), ended)

    def fan_out_state(self, job) -> FanOut | None:
        if not self.holds:
            raise LeaseLost()
        return self.state()

    def start_fan_out(self, job, rules, items, max_parallel):
        assert rules.child_only
        if not self.holds:
            return None
        if self.items is None:
            self.items, self.max_parallel = list(items), max_parallel
            self._release()
        return self.state()

    def _release(self) -> None:
        while (not self.cancelled and len(self.children_of) < len(self.items or [])
               and sum(c.status in ACTIVE for c in self.children_of.values()) < self.max_parallel):
            place = len(self.children_of)
            assert place not in self.children_of  # each place at most once
            self.children_of[place] = Child(place, Status.QUEUED)
            self.spawned.append(place)
        self.peak = max(self.peak, sum(c.status in ACTIVE for c in self.children_of.values()))

    def end_one(self) -> bool:
        """A worker ends the first unfinished child; its end releases the next."""
        unfinished = [c for c in self.children_of.values() if c.status in ACTIVE]
        if not unfinished:
            return False
        child = unfinished[0]
        if child.index in self.failing:
            child.status, child.error_code = Status.FAILED, "internal_error"
            child.error_message = "The job failed because of an internal error."
        else:
            child.status, child.result = Status.COMPLETED, {"part": child.index}
        self._release()
        return True

    def children(self, job):
        return [self.children_of[place] for place in sorted(self.children_of)]

    def cancel_children(self, job):
        self.cancelled = True
        for child in self.children_of.values():
            if child.status in ACTIVE:
                child.status = Status.CANCELLED


class FakeContext:
    def __init__(self, runtime: FakeRuntime, cancel_after_looks: int | None = None) -> None:
        self.runtime, self.job = runtime, SimpleNamespace(id=uuid.uuid4())
        self.progressed: list[tuple[int, int]] = []
        self.looks, self.cancel_after = 0, cancel_after_looks
        self.runs = 0

    def new_run(self) -> None:
        self.runs += 1

    def checkpoint(self) -> None:
        self.looks += 1
        if self.cancel_after is not None and self.looks > self.cancel_after:
            raise CancelRequested()

    def check_lease_now(self) -> None:
        if not self.runtime.holds:
            raise LeaseLost()
        self.checkpoint()

    def progress(self, stage: str, *, done: int, total: int) -> None:
        assert stage == "children"
        self.progressed.append((done, total))


def run(ctx: FakeContext, work: list[dict[str, str]], **options: Any) -> Any:
    """The parent's runs until it ends: each wait ends a run; meanwhile the workers end every
    child (the database releasing the next at each end), and the last end resumes it."""
    for _ in range(10):
        ctx.new_run()
        try:
            return fan_out(ctx, PART, work, **options)
        except WaitRequested as waiting:
            assert waiting.children == 1  # resumed once none is left active
            while ctx.runtime.end_one():
                pass
    raise AssertionError("the parent never ended")


def items(n: int) -> list[dict[str, str]]:
    return [{"project_id": str(uuid.uuid4())} for _ in range(n)]


def test_results_in_input_order_never_more_than_max_parallel_and_the_parent_runs_twice():
    runtime = FakeRuntime()
    ctx = FakeContext(runtime)
    assert run(ctx, items(9), max_parallel=3) == [{"part": n} for n in range(9)]
    assert runtime.peak == 3 and runtime.spawned == list(range(9))
    assert ctx.runs == 2  # it waited once, holding no worker, then collected
    assert ctx.progressed == [(0, 9), (9, 9)]


def test_every_failed_part_is_listed_once_all_have_ended():
    runtime = FakeRuntime(failing={1, 3})
    with pytest.raises(ChildrenFailed) as failed:
        run(FakeContext(runtime), items(4), max_parallel=4)
    assert failed.value.details["failed"] == [1, 3]
    # each by its place, status and code: a part's own message is its row's alone
    assert failed.value.message == (
        "2 of 4 parts did not complete: #2 failed (internal_error); #4 failed (internal_error)")
    assert all(c.status not in ACTIVE for c in runtime.children_of.values())


def test_a_bad_item_fails_the_parent_before_any_child_is_made():
    runtime = FakeRuntime()
    with pytest.raises(InvalidParams):
        run(FakeContext(runtime), [*items(2), {"project_id": "not-a-uuid"}])
    assert runtime.spawned == [] and runtime.items is None


def test_a_cancel_cancels_the_children_and_nothing_more_is_released():
    runtime = FakeRuntime()
    ctx = FakeContext(runtime, cancel_after_looks=1)  # asked after the first run's look
    ctx.new_run()
    with pytest.raises(WaitRequested):
        fan_out(ctx, PART, items(6), max_parallel=2)
    ctx.new_run()
    with pytest.raises(CancelRequested):
        fan_out(ctx, PART, items(6), max_parallel=2)
    assert runtime.cancelled and runtime.spawned == [0, 1]
    while runtime.end_one():
        pass
    assert runtime.spawned == [0, 1]


def test_a_run_that_lost_its_lease_starts_nothing():
    runtime = FakeRuntime()
    runtime.holds = False
    ctx = FakeContext(runtime)
    ctx.new_run()
    with pytest.raises(LeaseLost):
        fan_out(ctx, PART, items(3))
    assert runtime.spawned == []


def test_nothing_to_fan_out_is_an_empty_result():
    assert run(FakeContext(FakeRuntime()), []) == []


def test_a_later_run_carries_on_with_the_fan_out_the_first_one_started():
    runtime = FakeRuntime()
    ctx = FakeContext(runtime)
    ctx.new_run()
    with pytest.raises(WaitRequested):
        fan_out(ctx, PART, items(3), max_parallel=1)
    runtime.end_one()
    # The parent claimed again (its worker died, or it was resumed), its code computing other
    # items (the projects changed meanwhile): it finishes the fan-out it started, no child twice.
    assert run(ctx, items(5), max_parallel=1) == [{"part": n} for n in range(3)]
    assert runtime.spawned == [0, 1, 2]
