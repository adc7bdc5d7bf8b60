"""The waits chore (tasks/maintenance/waits.py) with its statement replaced by a fake: waiting
jobs whose condition came are counted and woken, one wake-up per claim batch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spacejobs.models.settings import get_settings
from spacejobs.tasks.maintenance import waits
from spacejobs.tasks.maintenance.waits import Waits, WaitsReport
from tests.unit.maintenance_fakes import Publisher, Transactions, ids, process


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    state = SimpleNamespace(resumed=[], batches=[], transactions=Transactions())

    def resume_due_waits(conn, *, batch):
        state.batches.append(batch)
        return state.resumed

    monkeypatch.setattr(waits, "transaction", state.transactions)
    monkeypatch.setattr(waits, "store", SimpleNamespace(resume_due_waits=resume_due_waits))
    return state


def chore() -> Waits:
    return Waits.from_settings(get_settings())


def test_waiting_jobs_whose_condition_came_are_woken(world):
    batch = get_settings().claim_batch
    world.resumed = [(j, "bench.wait") for j in ids(batch + 2)]
    publish = Publisher()
    report = chore().run(process(publish))
    assert (report.resumed, report.wakeups_sent, report.publish_failures) == (batch + 2, 2, 0)
    assert publish.calls == [(str(world.resumed[0][0]), True), (str(world.resumed[batch][0]), True)]
    assert world.batches == [Waits.batch] and world.transactions.actors == ["sweeper"]


def test_with_the_broker_down_the_resumed_jobs_are_counted_unwoken(world):
    world.resumed = [(j, "bench.wait") for j in ids(3)]
    report = chore().run(process(Publisher(fail_after=0)))
    assert (report.resumed, report.wakeups_sent, report.publish_failures) == (3, 0, 3)


def test_nothing_due_sends_nothing(world):
    publish = Publisher()
    assert chore().run(process(publish)) == WaitsReport() and publish.calls == []
