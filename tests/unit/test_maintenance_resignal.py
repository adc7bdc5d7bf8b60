"""The resignal chore (tasks/maintenance/resignal.py) with its statement replaced by a fake: how
many wake-ups it sends for how many due jobs, and what it does when the broker is down."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spacejobs.models.settings import get_settings
from spacejobs.tasks.maintenance import resignal
from spacejobs.tasks.maintenance.resignal import Resignal
from tests.unit.maintenance_fakes import Publisher, Transactions, ids, process


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    state = SimpleNamespace(due=[], grace=None, batch=None, transactions=Transactions())

    def sweep_unsignalled(conn, *, grace, batch):
        state.grace, state.batch = grace, batch
        return state.due

    monkeypatch.setattr(resignal, "transaction", state.transactions)
    monkeypatch.setattr(resignal, "store", SimpleNamespace(sweep_unsignalled=sweep_unsignalled))
    return state


def chore() -> Resignal:
    return Resignal.from_settings(get_settings())


def test_due_jobs_are_woken_one_wakeup_per_claim_batch(world):
    batch = get_settings().claim_batch
    world.due = [(j, "bench.noop") for j in ids(2 * batch + 1)]
    publish = Publisher()
    report = chore().run(process(publish))
    assert report.resignalled == 2 * batch + 1 and report.wakeups_sent == 3
    assert [job_id for job_id, _ in publish.calls] == [
        str(world.due[0][0]), str(world.due[batch][0]), str(world.due[2 * batch][0])]
    assert all(force for _, force in publish.calls)
    assert world.grace == get_settings().wakeup_grace and world.batch == Resignal.batch
    assert world.transactions.actors == ["sweeper"]


def test_nothing_due_sends_no_wakeup(world):
    publish = Publisher()
    report = chore().run(process(publish))
    assert publish.calls == [] and report.wakeups_sent == 0 and report.resignalled == 0


def test_a_broker_that_fails_stops_the_run_and_counts_every_job_left_unwoken(world):
    batch = get_settings().claim_batch
    world.due = [(j, "bench.noop") for j in ids(3 * batch)]
    publish = Publisher(fail_after=1)
    report = chore().run(process(publish))
    assert len(publish.calls) == 2  # the first went through, the second failed: no third try
    assert report.wakeups_sent == 1
    assert report.publish_failures == 3 * batch - batch
