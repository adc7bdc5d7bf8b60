"""The tests' one deadline loop (tests/kit/waiting.py), with a clock the test moves."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.kit import waiting
from tests.kit.waiting import wait_until


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    monkeypatch.setattr(waiting, "time", SimpleNamespace(monotonic=lambda: now[0], sleep=sleep))
    return now


def test_it_returns_the_first_true_value_once_it_comes(clock):
    answers = iter([None, 0, [], {"status": "completed"}])
    assert wait_until(lambda: next(answers), timeout=5) == {"status": "completed"}
    assert clock[0] == pytest.approx(0.3)  # three polls 0.1 s apart


def test_a_condition_that_holds_at_once_costs_no_wait(clock):
    assert wait_until(lambda: "yes") == "yes" and clock[0] == 0


def test_it_gives_up_after_the_timeout_saying_what_was_not_reached(clock):
    with pytest.raises(AssertionError, match=r"^the worker shown online not reached in 2 s$"):
        wait_until(lambda: False, timeout=2, what="the worker shown online")
    assert 2 < clock[0] <= 2.2


def test_the_description_is_asked_for_only_at_the_end_with_the_facts_then(clock):
    seen = []

    def condition() -> bool:
        seen.append(clock[0])
        return False

    with pytest.raises(AssertionError, match=r"after 4 looks"):
        wait_until(condition, timeout=0.3, interval=0.1, what=lambda: f"after {len(seen)} looks")


def test_its_own_failure_type_and_interval_are_the_callers(clock):
    class NotReady(Exception):
        pass

    with pytest.raises(NotReady):
        wait_until(lambda: False, timeout=1, interval=0.5, failure=NotReady)
    assert clock[0] == pytest.approx(1.5)


def test_a_condition_may_give_up_at_once_by_raising(clock):
    def died() -> bool:
        raise RuntimeError("the process exited")

    with pytest.raises(RuntimeError, match="exited"):
        wait_until(died, timeout=60)
    assert clock[0] == 0
