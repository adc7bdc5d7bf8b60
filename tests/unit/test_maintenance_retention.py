"""The retention chore (tasks/maintenance/retention.py) with the purges replaced by fakes:
what it counts, that it purges batch after batch while they come back full (and no more than
its rounds), and that the stored files of purged rows are deleted after their commit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from spacejobs.models.jobs.store import RetentionHorizons
from spacejobs.models.settings import get_settings
from spacejobs.tasks.maintenance import retention
from spacejobs.tasks.maintenance.retention import PURGE_ROUNDS, Retention
from tests.unit.maintenance_fakes import FakeResults, Transactions, process

NOTHING = {"jobs_deleted": 0, "results_dropped": 0, "events_deleted": 0, "dropped_refs": []}
T0 = datetime(2026, 12, 6, tzinfo=UTC)


def at(minute: int) -> RetentionHorizons:
    """Every step's horizon ``minute`` minutes after T0."""
    moment = T0 + timedelta(minutes=minute)
    return RetentionHorizons(jobs=moment, results=moment, events=moment)


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    state = SimpleNamespace(purged=[], audit=[], transactions=Transactions(), events=[],
                            starts=[])

    def purge_finished(conn, *, batch, horizons):
        state.events.append(("purge", len(state.transactions.actors)))
        state.starts.append(horizons)
        purged = state.purged.pop(0) if state.purged else dict(NOTHING)
        return {"horizons": RetentionHorizons(), **purged}

    def purge_audit(conn, *, batch):
        return state.audit.pop(0) if state.audit else 0

    monkeypatch.setattr(retention, "transaction", state.transactions)
    monkeypatch.setattr(retention, "store", SimpleNamespace(purge_finished=purge_finished))
    monkeypatch.setattr(retention, "audit", SimpleNamespace(purge=purge_audit))
    return state


def chore() -> Retention:
    return Retention.from_settings(get_settings())


def test_files_of_purged_rows_are_deleted_after_their_commit_and_a_failure_is_left(world):
    world.purged = [{"jobs_deleted": 4, "results_dropped": 2, "events_deleted": 9,
                     "dropped_refs": ["o/j/1", "o/j/2", "o/j/3"]}]
    world.audit = [6]
    results = FakeResults(failing=frozenset({"o/j/2"}))
    report = chore().run(process(results=results))
    assert (report.jobs_deleted, report.results_dropped, report.events_deleted,
            report.audit_deleted) == (4, 2, 9, 6)
    # o/j/2 is left to the orphan sweep (result_orphans.py).
    assert results.deleted == ["o/j/1", "o/j/3"] and report.files_deleted == 2
    assert report.batches == 1
    assert set(world.transactions.actors) == {"sweeper"}  # audited as the sweeper's


def test_retention_purges_batch_after_batch_while_they_come_back_full(world):
    # A steady load above one batch a run must not grow the history without bound: full
    # batches are followed by another, each in its own transaction, until one comes back short.
    batch = Retention.batch
    world.purged = [
        {"jobs_deleted": batch, "results_dropped": 0, "events_deleted": 0, "dropped_refs": ["a"]},
        {"jobs_deleted": 0, "results_dropped": 0, "events_deleted": batch, "dropped_refs": []},
        {"jobs_deleted": 120, "results_dropped": 3, "events_deleted": 7, "dropped_refs": ["b"]}]
    results = FakeResults()
    report = chore().run(process(results=results))
    assert world.purged == []
    assert (report.jobs_deleted, report.results_dropped, report.events_deleted) == (
        batch + 120, 3, batch + 7)
    assert results.deleted == ["a", "b"] and report.batches == 3
    assert world.events == [("purge", 1), ("purge", 2), ("purge", 3)]  # one transaction each


def test_a_full_audit_batch_alone_takes_another_round(world):
    world.audit = [Retention.batch, 3]
    report = chore().run(process())
    assert report.batches == 2 and report.audit_deleted == Retention.batch + 3


def test_a_purge_that_never_catches_up_stops_after_its_rounds(world, monkeypatch):
    calls = []

    def full(conn, *, batch, horizons):
        calls.append(batch)
        return {"jobs_deleted": batch, "results_dropped": 0, "events_deleted": 0,
                "dropped_refs": [], "horizons": RetentionHorizons()}

    monkeypatch.setattr(retention.store, "purge_finished", full)
    report = chore().run(process())
    assert len(calls) == PURGE_ROUNDS and calls[0] == Retention.batch
    assert report.jobs_deleted == PURGE_ROUNDS * Retention.batch
    assert report.batches == PURGE_ROUNDS


def test_nothing_past_the_policy_is_one_batch_and_nothing_deleted(world):
    report = chore().run(process())
    assert report == retention.RetentionReport(batches=1)


def test_each_batch_starts_where_the_one_before_left_and_the_next_run_too(world):
    batch = Retention.batch
    world.purged = [
        {**NOTHING, "jobs_deleted": batch, "horizons": at(1)},
        {**NOTHING, "jobs_deleted": 7, "horizons": at(2)},
        {**NOTHING, "horizons": at(3)}]
    one = chore()
    one.run(process())
    one.run(process())
    # the first run from the first job; its second batch, and the next run, from the horizons
    assert world.starts == [None, at(1), at(2)]


def test_every_full_every_runs_start_from_the_first_job_again(world):
    one = chore()
    one.horizon.full_every = 3
    for minute in range(7):
        world.purged.append({**NOTHING, "horizons": at(minute)})
        one.run(process())
    assert world.starts == [None, at(0), at(1), None, at(3), at(4), None]
