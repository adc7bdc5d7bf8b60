"""Beat's schedule of the maintenance chores (tasks/maintenance/schedule.py) on a fake clock,
with fake chores: each runs on its own cadence, the ones due at one tick in the list's order,
one that raises does not stop the others and is logged once per outage, not every run, and
beat's line says what each did. And the chores a beat runs, as the settings make them."""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from spacejobs.models.settings import Settings
from spacejobs.tasks import maintenance
from spacejobs.tasks.maintenance.chore import Report
from spacejobs.tasks.maintenance.schedule import FAILURE_LOG_EVERY, Maintenance


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Counts(Report):
    done: int = 0
    publish_failures: int = 0


class FakeChore:
    def __init__(self, name: str, interval: float, clock: Clock, *, frequent: bool = False,
                 takes: float = 0.0, ran: list[str] | None = None) -> None:
        self.name, self.interval, self.frequent = name, interval, frequent
        self.clock, self.takes = clock, takes
        self.started: list[float] = []
        self.processes: list[object] = []
        self.ran = ran if ran is not None else []
        self.failing = False
        self.report = Counts(done=1)

    def run(self, process: object) -> Counts:
        self.processes.append(process)
        self.started.append(self.clock.now)
        self.ran.append(self.name)
        self.clock.now += self.takes
        if self.failing:
            raise OSError("connection refused")
        return self.report


def schedule(clock: Clock, *chores: FakeChore) -> Maintenance:
    return Maintenance(chores, lambda: "the process", clock=clock)


def ticks(found: Maintenance, clock: Clock, seconds: float, step: float = 0.25) -> None:
    """Beat's loop for ``seconds``: a tick, then the clock moves on."""
    end = clock.now + seconds
    while clock.now < end - 1e-9:
        found.run_due()
        clock.now += step


def test_each_chore_runs_on_its_own_cadence_the_first_run_at_once():
    clock = Clock()
    fast = FakeChore("fast", 0.5, clock, frequent=True)
    sweep = FakeChore("sweep", 2.0, clock)
    slow = FakeChore("slow", 3.0, clock)
    found = schedule(clock, fast, sweep, slow)
    assert found.seconds_left() == 0
    ticks(found, clock, 6.0)
    assert fast.started == pytest.approx([100 + 0.5 * n for n in range(12)])
    assert sweep.started == pytest.approx([100, 102, 104])
    assert slow.started == pytest.approx([100, 103])
    # Beat sleeps until the next chore is due: fast's, at 106.0.
    assert clock.now == pytest.approx(106.0) and found.seconds_left() == 0
    clock.now -= 0.1
    assert found.seconds_left() == pytest.approx(0.1)


def test_the_next_run_is_one_interval_after_the_run_ended():
    clock = Clock()
    slow = FakeChore("slow", 1.0, clock, takes=5.0)  # a connect timeout
    found = schedule(clock, slow)
    found.run_due()
    assert clock.now == pytest.approx(105.0) and found.seconds_left() == pytest.approx(1.0)


def test_chores_of_one_cadence_stay_in_one_tick_however_long_each_takes(caplog):
    clock = Clock()
    chores = [FakeChore(name, 1.0, clock, takes=0.03) for name in ("leases", "waits", "metrics")]
    found = schedule(clock, *chores)
    with caplog.at_level(logging.INFO, logger="spacejobs.maintenance"):
        ticks(found, clock, 5.0, step=0.01)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == len(chores[0].started) >= 4  # one line a tick, not one a chore
    assert all(all(f"{name} {{" in line for name in ("leases", "waits", "metrics"))
               for line in lines)


def test_the_chores_due_at_one_tick_run_in_the_lists_order():
    clock = Clock()
    ran: list[str] = []
    chores = [FakeChore(name, 1.0, clock, ran=ran) for name in ("periodic", "timers", "leases")]
    found = schedule(clock, *chores)
    found.run_due()
    clock.now += 1.0
    found.run_due()
    assert ran == ["periodic", "timers", "leases"] * 2


def test_a_chore_that_raises_does_not_stop_the_others_and_is_tried_again_at_its_cadence():
    clock = Clock()
    ran: list[str] = []
    first = FakeChore("first", 1.0, clock, ran=ran)
    broken = FakeChore("broken", 2.0, clock, ran=ran, takes=0.5)
    last = FakeChore("last", 1.0, clock, ran=ran)
    broken.failing = True
    found = schedule(clock, first, broken, last)
    done = found.run_due()  # never raises
    assert ran == ["first", "broken", "last"]
    assert set(done) == {"first", "last"}  # what succeeded, with its report
    # Its next try is one interval after the failure ended, like a run's.
    assert found.slots[1].seconds_left() == pytest.approx(2.0)
    ticks(found, clock, 4.0)
    assert broken.started == pytest.approx([100, 102.5])
    assert len(first.started) >= 4 and len(last.started) >= 4
    assert set(first.processes + broken.processes) == {"the process"}  # this beat's, each run


def test_a_failing_chore_is_logged_once_then_once_a_minute_and_its_end_once(caplog):
    clock = Clock()
    timers = FakeChore("timers", 0.25, clock, frequent=True)
    timers.failing = True
    found = schedule(clock, timers)
    with caplog.at_level(logging.INFO, logger="spacejobs.maintenance"):
        for _ in range(int(FAILURE_LOG_EVERY / 0.25) + 2):  # a minute and a bit of runs
            found.run_due()
            clock.now += 0.25
        timers.failing = False
        found.run_due()
        clock.now += 0.25
        timers.failing = True
        found.run_due()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["ERROR", "WARNING", "INFO", "ERROR"]
    assert lines[0][1] == "chore timers failed; trying again every 0.25s"
    assert caplog.records[0].exc_info is not None  # the first failure with its traceback
    assert lines[1][1].startswith("chore timers: still failing (")
    assert lines[2][1].startswith("chore timers works again after 242 failed tries")


def test_beats_line_says_what_each_chore_did_and_the_frequent_ones_since_the_last_line(caplog):
    clock = Clock()
    timers = FakeChore("timers", 0.25, clock, frequent=True)
    sweep = FakeChore("sweep", 1.0, clock)
    found = schedule(clock, timers, sweep)
    with caplog.at_level(logging.INFO, logger="spacejobs.maintenance"):
        ticks(found, clock, 1.0)  # timers 4 runs, sweep 1
        ticks(found, clock, 0.25)  # the next line's timers are counted afresh
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2  # one for each tick a chore that is not frequent ran in, no more
    assert lines[0].startswith("maintenance ran in ")
    assert lines[0].endswith(": sweep {'done': 1, 'publish_failures': 0}; since the last line:"
                             " timers 1 runs {'done': 1, 'publish_failures': 0}")
    assert lines[1].endswith("timers 4 runs {'done': 4, 'publish_failures': 0}")


def test_wake_ups_left_unpublished_add_a_warning_to_the_line(caplog):
    clock = Clock()
    sweep = FakeChore("sweep", 1.0, clock)
    sweep.report = Counts(done=1, publish_failures=7)
    with caplog.at_level(logging.INFO, logger="spacejobs.maintenance"):
        schedule(clock, sweep).run_due()
    assert caplog.records[-1].levelname == "WARNING"
    assert caplog.records[-1].getMessage().startswith(
        "maintenance: broker unreachable, wake-ups for 7 jobs deferred")


def test_a_report_lists_every_count_by_name_and_adds_up():
    report = Counts(done=1)
    report.add(Counts(done=2, publish_failures=3))
    assert report.as_dict() == {"done": 3, "publish_failures": 3}


# ------------------------------------------------------------------------- the chores of a beat

def test_a_beat_runs_every_chore_in_order_each_with_the_cadence_the_settings_give_it():
    tick = json.dumps([{"name": "tick", "kind": "bench.noop", "organization_id": str(uuid.uuid4()),
                        "requested_by": str(uuid.uuid4()), "schedule": "every 2s"}])
    settings = Settings(sweep_interval=5, timer_interval=0.25, results_sweep_interval=600,
                        periodic_jobs=tick)
    found = {chore.name: chore.interval for chore in maintenance.chores(settings)}
    assert list(found) == ["periodic", "timers", "expired_leases", "waits", "resignal",
                           "retention", "metrics", "result_orphans", "claim_heads"]
    assert found == {"periodic": 0.25, "timers": 0.25, "expired_leases": 5, "waits": 5,
                     "resignal": 5, "retention": 5, "metrics": 5, "result_orphans": 600,
                     "claim_heads": 1}
    own = settings.model_copy(update={"maintenance_retention_interval": 60,
                                      "maintenance_resignal_interval": 1,
                                      "maintenance_periodic_interval": 2})
    assert {chore.name: chore.interval for chore in maintenance.chores(own)} == {
        "periodic": 2, "timers": 0.25, "expired_leases": 5, "waits": 5, "resignal": 1,
        "retention": 60, "metrics": 5, "result_orphans": 600, "claim_heads": 1}
    assert [chore.name for chore in maintenance.chores(settings) if chore.frequent] == [
        "periodic", "timers", "claim_heads"]
    # No periodic job configured: no chore for them.
    assert "periodic" not in {chore.name for chore in maintenance.chores(
        settings.model_copy(update={"periodic_jobs": "[]"}))}


def test_a_sweep_on_demand_runs_the_sweeps_chores_once_in_order(monkeypatch):
    ran: list[str] = []
    clock = Clock()
    fakes = [FakeChore(name, 5, clock, ran=ran) for name in ("a", "b")]
    monkeypatch.setattr(maintenance, "sweep_chores", lambda settings: fakes)
    process = SimpleNamespace(settings=None)
    done = maintenance.sweep_now(process)
    assert ran == ["a", "b"] and fakes[0].processes == [process]
    assert done == {"a": {"done": 1, "publish_failures": 0}, "b": {"done": 1, "publish_failures": 0}}
