"""The periodic-jobs chore (tasks/maintenance/periodic.py) on a fake clock with the submit
replaced by a fake: each job once per period by this beat, a replay counted as another beat's,
and a job whose submit fails retried at the next run without keeping the others, its failure
logged once, not every run."""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from spacejobs.models.jobs import periodic as configured
from spacejobs.models.jobs.periodic import PeriodicEntry, Schedule
from spacejobs.models.settings import Settings
from spacejobs.tasks.maintenance import periodic
from spacejobs.tasks.maintenance.periodic import Periodic, PeriodicReport
from tests.unit.maintenance_fakes import Transactions, process

START = datetime(2026, 12, 1, 4, 0, 0, tzinfo=UTC)


def job(name: str, schedule: str = "every 10s") -> configured.Periodic:
    entry = PeriodicEntry(name=name, kind="bench.noop", organization_id=uuid.uuid4(),
                          requested_by=uuid.uuid4())
    return configured.Periodic(entry, Schedule.parse(schedule))


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    state = SimpleNamespace(now=START, clock=100.0, submits=[], taken=set(), down=set(),
                            transactions=Transactions())

    def submit_period(jobs, conn, found, period):
        key = found.key(period)
        state.submits.append(key)
        if found.entry.name in state.down:
            raise OSError("connection refused")
        created = key not in state.taken
        state.taken.add(key)
        return SimpleNamespace(created=created, job=SimpleNamespace(id=uuid.uuid4()))

    monkeypatch.setattr(periodic, "transaction", state.transactions)
    monkeypatch.setattr(configured, "submit_period", submit_period)
    return state


def chore(world, *jobs: configured.Periodic) -> Periodic:
    return Periodic(0.25, jobs, now=lambda: world.now, clock=lambda: world.clock)


def test_each_job_is_submitted_once_per_period(world):
    found = chore(world, job("tick"), job("slow", "every 1m"))
    assert found.run(process(jobs="jobs")) == PeriodicReport(submitted=2)
    world.now += timedelta(seconds=9)
    assert found.run(process(jobs="jobs")) == PeriodicReport()  # same periods: no statement
    world.now += timedelta(seconds=1)
    assert found.run(process(jobs="jobs")) == PeriodicReport(submitted=1)
    assert world.submits == [f"periodic:tick:{START.isoformat()}",
                             f"periodic:slow:{START.isoformat()}",
                             f"periodic:tick:{(START + timedelta(seconds=10)).isoformat()}"]
    assert set(world.transactions.actors) == {"beat"}


def test_a_period_another_beat_submitted_first_is_counted_as_such(world, caplog):
    world.taken.add(f"periodic:tick:{START.isoformat()}")
    with caplog.at_level(logging.INFO, logger="spacejobs.maintenance"):
        assert chore(world, job("tick")).run(process(jobs="jobs")) == PeriodicReport(already=1)
    assert "already submitted by another beat" in caplog.text


def test_a_failing_job_is_retried_each_run_without_stopping_the_others_and_logged_once(
        world, caplog):
    found = chore(world, job("broken"), job("fine"))
    world.down.add("broken")
    with caplog.at_level(logging.INFO, logger="spacejobs.maintenance"):
        for _ in range(5):
            report = found.run(process(jobs="jobs"))
            world.clock += 0.25
        assert report == PeriodicReport(failed=1)
        world.down.clear()
        assert found.run(process(jobs="jobs")) == PeriodicReport(submitted=1)
    assert world.submits.count(f"periodic:broken:{START.isoformat()}") == 6
    assert world.submits.count(f"periodic:fine:{START.isoformat()}") == 1
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines[0] == ("ERROR", "periodic job broken not submitted; trying again every 0.25s")
    assert caplog.records[0].exc_info is not None  # the first failure with its traceback
    assert lines[1][1].startswith("periodic job fine for ")
    assert lines[2][1].startswith("periodic job broken works again after 5 failed tries")
    assert lines[3][1].startswith("periodic job broken for ")
    assert len(lines) == 4


def test_the_configuration_and_the_cadence_come_from_the_settings():
    entry = {"name": "tick", "kind": "bench.noop", "organization_id": str(uuid.uuid4()),
             "requested_by": str(uuid.uuid4()), "schedule": "every 2s"}
    settings = Settings(periodic_jobs=json.dumps([entry]), timer_interval=0.5)
    found = Periodic.from_settings(settings)
    assert [each.entry.name for each in found.jobs] == ["tick"]
    assert found.interval == 0.5  # the timers' cadence unless set
    assert Periodic.from_settings(settings.model_copy(
        update={"maintenance_periodic_interval": 3.0})).interval == 3.0
