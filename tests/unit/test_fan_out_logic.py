"""A parent's fan-out (models/jobs/fanout.py) over a fake runtime that runs each child on the
parent's next look: results in input order, never more than max_parallel unfinished, every
failed part listed, a cancel passed on to the children, and a parent that waits for its
children without a worker (each wait ends the run; the next run carries on from the rows)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from models.errors import CancelRequested, InvalidParams, WaitRequested
from models.jobs.fanout import ChildrenFailed, fan_out
from models.jobs.records import ACTIVE, Status
from models.kinds import load_kinds

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
    def __init__(self, failing: set[int] = frozenset(), finish_per_look: int = 1) -> None:
        self.children_of: dict[int, Child] = {}
        self.failing = failing
        self.finish_per_look = finish_per_look
        self.peak = 0
        self.spawned: list[int] = []
        self.cancelled = False

    def children(self, job):
        unfinished = [c for c in self.children_of.values() if c.status in ACTIVE]
        for child in unfinished[:self.finish_per_look]:  # the workers got through some
            if child.index in self.failing:
                child.status, child.error_code = Status.FAILED, "internal_error"
                child.error_message = "The job failed because of an internal error."
            else:
                child.status, child.result = Status.COMPLETED, {"part": child.index}
        return list(self.children_of.values())

    def spawn_children(self, job, rules, placed):
        assert rules.child_only
        for place, _params in placed:
            assert place not in self.children_of  # each place at most once
            self.children_of[place] = Child(place, Status.QUEUED)
            self.spawned.append(place)
        self.peak = max(self.peak, sum(c.status in ACTIVE for c in self.children_of.values()))

    def cancel_children(self, job):
        self.cancelled = True


class FakeContext:
    def __init__(self, runtime: FakeRuntime, cancel_after_looks: int | None = None) -> None:
        self.runtime, self.job = runtime, SimpleNamespace(id=uuid.uuid4())
        self.progressed: list[tuple[int, int]] = []
        self.looks, self.cancel_after = 0, cancel_after_looks
        self.steps: dict[str, Any] = {}
        self.names: dict[str, int] = {}
        self.runs = 0

    def new_run(self) -> None:
        self.names, self.runs = {}, self.runs + 1

    def next_step_name(self, what: str) -> str:
        self.names[what] = self.names.get(what, 0) + 1
        return f"{what}#{self.names[what]}"

    def step(self, name: str, fn):
        if name not in self.steps:
            self.steps[name] = fn()
        return self.steps[name]

    def checkpoint(self) -> None:
        self.looks += 1
        if self.cancel_after is not None and self.looks > self.cancel_after:
            raise CancelRequested()

    def progress(self, stage: str, *, done: int, total: int) -> None:
        assert stage == "children"
        self.progressed.append((done, total))


def run(ctx: FakeContext, work: list[dict[str, str]], **options: Any) -> Any:
    """The parent's runs until it ends: each wait ends a run, the next one is a resume."""
    for _ in range(1000):
        ctx.new_run()
        try:
            return fan_out(ctx, PART, work, **options)
        except WaitRequested as waiting:
            assert waiting.children is not None and waiting.children > 0
    raise AssertionError("the parent never ended")


def items(n: int) -> list[dict[str, str]]:
    return [{"project_id": str(uuid.uuid4())} for _ in range(n)]


def test_results_come_back_in_input_order_and_never_more_than_max_parallel_run_at_once():
    runtime = FakeRuntime(finish_per_look=2)
    ctx = FakeContext(runtime)
    assert run(ctx, items(9), max_parallel=3) == [{"part": n} for n in range(9)]
    assert runtime.peak == 3 and sorted(runtime.spawned) == list(range(9))
    assert ctx.runs > 1  # it waited between looks instead of holding its worker
    assert ctx.progressed[-1] == (9, 9)
    assert [done for done, _ in ctx.progressed] == sorted(done for done, _ in ctx.progressed)


def test_every_failed_part_is_listed_once_all_have_ended():
    runtime = FakeRuntime(failing={1, 3})
    with pytest.raises(ChildrenFailed) as failed:
        run(FakeContext(runtime), items(4), max_parallel=4)
    assert failed.value.details["failed"] == [1, 3]
    assert failed.value.message.startswith("2 of 4 parts did not complete: #2 failed (internal_error")
    assert all(c.status not in ACTIVE for c in runtime.children_of.values())


def test_a_bad_item_fails_the_parent_before_any_child_is_made():
    runtime = FakeRuntime()
    with pytest.raises(InvalidParams):
        run(FakeContext(runtime), [*items(2), {"project_id": "not-a-uuid"}])
    assert runtime.spawned == []


def test_a_cancel_cancels_the_children_and_stops_spawning():
    runtime = FakeRuntime(finish_per_look=0)  # nothing ever finishes
    with pytest.raises(CancelRequested):
        run(FakeContext(runtime, cancel_after_looks=3), items(6), max_parallel=2)
    assert runtime.cancelled and len(runtime.spawned) == 2


def test_a_parent_claimed_again_carries_on_with_the_children_it_already_made():
    runtime = FakeRuntime()
    runtime.children_of = {0: Child(0, Status.COMPLETED, {"part": 0}), 2: Child(2, Status.LEASED)}
    assert run(FakeContext(runtime), items(3), max_parallel=2) == [
        {"part": 0}, {"part": 1}, {"part": 2}]
    assert runtime.spawned == [1]  # only the place the earlier attempt never reached


def test_nothing_to_fan_out_is_an_empty_result():
    assert run(FakeContext(FakeRuntime()), []) == []


def test_every_run_fans_out_the_items_of_the_first_one():
    runtime = FakeRuntime(finish_per_look=0)  # the first run finds its child still running
    ctx = FakeContext(runtime)
    ctx.new_run()
    with pytest.raises(WaitRequested):
        fan_out(ctx, PART, items(3), max_parallel=1)
    runtime.finish_per_look = 1
    # A later run whose code computed other items (the projects changed meanwhile) still
    # finishes the fan-out it started: the items are the recorded step's.
    assert run(ctx, items(5), max_parallel=1) == [{"part": n} for n in range(3)]

