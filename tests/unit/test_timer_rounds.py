"""Beat's rounds of due timers (tasks/timer_rounds.py) on a fake clock: when a round is due,
what beat is told to sleep, what the rounds add up to between sweeps, and that a failing round
(PostgreSQL down) is logged once, not every round, and never stops the next."""

from __future__ import annotations

import logging

import pytest

from spacejobs.tasks.sweeper import TimersReport
from spacejobs.tasks.timer_rounds import FAILURE_LOG_EVERY, TimerRounds


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def down() -> TimersReport:
    raise OSError("connection refused")


def test_the_first_round_runs_at_once_then_one_interval_after_each_round():
    clock = Clock()
    rounds = TimerRounds(0.25, clock=clock)
    assert rounds.seconds_left() == 0
    ran: list[float] = []

    def run() -> TimersReport:
        ran.append(clock.now)
        clock.now += 0.05  # the round itself takes time
        return TimersReport(resumed=1)

    assert rounds.run_if_due(run) == TimersReport(resumed=1)
    assert rounds.seconds_left() == pytest.approx(0.25)
    clock.now += 0.2
    assert rounds.run_if_due(run) is None  # not due yet
    assert rounds.seconds_left() == pytest.approx(0.05)
    clock.now += 0.05
    assert rounds.run_if_due(run) is not None
    assert ran == [pytest.approx(100.0), pytest.approx(100.3)]


def test_the_totals_since_the_last_sweep_are_read_once():
    clock = Clock()
    rounds = TimerRounds(0.25, clock=clock)
    for report in (TimersReport(2, 1, 0), TimersReport(), TimersReport(3, 0, 3)):
        rounds.run_if_due(lambda r=report: r)
        clock.now += 0.25
    rounds.run_if_due(down)  # a failed round adds nothing
    assert rounds.take_totals() == (3, TimersReport(5, 1, 3))
    assert rounds.take_totals() == (0, TimersReport())


def test_a_failing_round_is_logged_once_then_once_a_minute_and_its_end_once(caplog):
    clock = Clock()
    rounds = TimerRounds(0.25, clock=clock)
    with caplog.at_level(logging.INFO, logger="spacejobs.beat"):
        for _ in range(int(FAILURE_LOG_EVERY / 0.25) + 2):  # a minute and a bit of rounds
            assert rounds.run_if_due(down) is None  # never raises
            clock.now += 0.25
        rounds.run_if_due(lambda: TimersReport())
        clock.now += 0.25
        rounds.run_if_due(down)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["ERROR", "WARNING", "INFO", "ERROR"]
    assert lines[0][1] == "timers: a round of due timers failed; trying again every 0.25s"
    assert caplog.records[0].exc_info is not None  # the first failure with its traceback
    assert lines[1][1].startswith("timers: rounds of due timers still failing (")
    assert lines[2][1].startswith("timers: rounds of due timers work again after 242 failed")


def test_a_failed_round_waits_an_interval_after_it_ended():
    clock = Clock()
    rounds = TimerRounds(0.25, clock=clock)

    def slow_failure() -> TimersReport:
        clock.now += 5  # a connect timeout
        raise OSError("timeout")

    rounds.run_if_due(slow_failure)
    assert rounds.seconds_left() == pytest.approx(0.25)
