"""The timers chore (tasks/maintenance/timers.py) with its statement replaced by a fake: a run is
the timers' one statement and the wake-ups of what it resumed, recorded as beat's; with the
broker down it counts what it left unwoken and logs nothing (it runs four times a second)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spacejobs.models.settings import get_settings
from spacejobs.tasks.maintenance import timers
from spacejobs.tasks.maintenance.timers import Timers, TimersReport
from tests.unit.maintenance_fakes import Publisher, Transactions, ids, process


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    state = SimpleNamespace(timers=[], batches=[], transactions=Transactions())

    def resume_due_timers(conn, *, batch):
        state.batches.append(batch)
        return state.timers

    monkeypatch.setattr(timers, "transaction", state.transactions)
    # Only the timers' statement: a run that called another would fail here.
    monkeypatch.setattr(timers, "store", SimpleNamespace(resume_due_timers=resume_due_timers))
    return state


def chore() -> Timers:
    return Timers.from_settings(get_settings())


def test_the_timers_cadence_is_the_timer_interval_and_its_runs_are_added_up():
    assert chore().interval == get_settings().timer_interval and Timers.frequent


def test_a_run_runs_only_the_timers_statement_and_wakes_one_per_claim_batch(world):
    batch = get_settings().claim_batch
    world.timers = [(j, "bench.wait") for j in ids(batch + 1)]
    publish = Publisher()
    report = chore().run(process(publish))
    assert (report.resumed, report.wakeups_sent, report.publish_failures) == (batch + 1, 2, 0)
    assert publish.calls == [(str(world.timers[0][0]), True), (str(world.timers[batch][0]), True)]
    assert world.batches == [Timers.batch] and world.transactions.actors == ["beat"]


def test_a_run_with_the_broker_down_counts_the_jobs_left_unwoken_and_logs_nothing(world, caplog):
    world.timers = [(j, "bench.wait") for j in ids(3)]
    with caplog.at_level("INFO", logger="spacejobs"):
        report = chore().run(process(Publisher(fail_after=0)))
    assert (report.resumed, report.wakeups_sent, report.publish_failures) == (3, 0, 3)
    # Counted for beat's line, not logged four times a second while Redis is down.
    assert caplog.records == []


def test_a_run_with_no_timer_due_sends_nothing(world):
    publish = Publisher()
    assert chore().run(process(publish)) == TimersReport() and publish.calls == []
