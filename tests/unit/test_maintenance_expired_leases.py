"""The expired-leases chore (tasks/maintenance/expired_leases.py) with its statement replaced
by a fake: what it counts, that only the jobs it put back in the queue are woken, one
wake-up per claim batch, and that each run starts from the horizon the run before it left, but
the first and every ``full_every``-th, which start from the first lease."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from spacejobs.models.jobs.records import Status
from spacejobs.models.settings import get_settings
from spacejobs.tasks.maintenance import expired_leases
from spacejobs.tasks.maintenance.expired_leases import ExpiredLeases
from tests.unit.maintenance_fakes import Publisher, Transactions, ids, process


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    state = SimpleNamespace(expired=[], batches=[], starts=[], transactions=Transactions())

    def sweep_expired_leases(conn, *, batch, from_at):
        state.batches.append(batch)
        state.starts.append(from_at)
        return state.expired

    def expired_leases_horizon(conn, *, from_at):
        return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=len(state.starts))

    monkeypatch.setattr(expired_leases, "transaction", state.transactions)
    monkeypatch.setattr(expired_leases, "store",
                        SimpleNamespace(sweep_expired_leases=sweep_expired_leases,
                                        expired_leases_horizon=expired_leases_horizon))
    return state


def chore() -> ExpiredLeases:
    return ExpiredLeases.from_settings(get_settings())


def test_expired_leases_are_counted_by_what_became_of_them_and_only_requeued_ones_woken(world):
    requeued, failed, cancelled = ids(2), ids(1), ids(3)
    world.expired = ([(j, Status.QUEUED) for j in requeued] + [(j, Status.FAILED) for j in failed]
                     + [(j, Status.CANCELLED) for j in cancelled])
    publish = Publisher()
    report = chore().run(process(publish))
    assert (report.requeued, report.failed, report.cancelled) == (2, 1, 3)
    assert publish.calls == [(str(requeued[0]), True)]  # one forced wake-up for the batch
    assert report.wakeups_sent == 1 and report.publish_failures == 0
    # One bounded batch a run, recorded as the sweeper's.
    assert world.batches == [ExpiredLeases.batch] and world.transactions.actors == ["sweeper"]


def test_requeued_jobs_are_woken_one_wakeup_per_claim_batch(world):
    batch = get_settings().claim_batch
    world.expired = [(j, Status.QUEUED) for j in ids(batch + 1)]
    publish = Publisher()
    report = chore().run(process(publish))
    assert report.wakeups_sent == 2
    assert [job_id for job_id, _ in publish.calls] == [str(world.expired[0][0]),
                                                       str(world.expired[batch][0])]


def test_with_the_broker_down_the_jobs_left_unwoken_are_counted(world):
    world.expired = [(j, Status.QUEUED) for j in ids(5)]
    report = chore().run(process(Publisher(fail_after=0)))
    assert (report.requeued, report.wakeups_sent, report.publish_failures) == (5, 0, 5)


def test_nothing_expired_sends_nothing(world):
    publish = Publisher()
    report = chore().run(process(publish))
    assert report == expired_leases.ExpiredLeasesReport() and publish.calls == []


def test_each_run_starts_from_the_horizon_the_last_left_and_now_and_then_from_the_first(world):
    sweeper = chore()
    sweeper.horizon.full_every = 3
    for _ in range(7):
        sweeper.run(process(Publisher()))
    minute = [datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=n) for n in range(8)]
    assert world.starts == [None, minute[1], minute[2], None, minute[4], minute[5], None]
