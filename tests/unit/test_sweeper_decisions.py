"""The sweeper's decisions (tasks/sweeper.py) with the store's statements replaced by fakes:
what it counts, how many wake-ups it sends for how many due jobs, what it does when the broker
is down, and when stored files are deleted."""

from __future__ import annotations

import contextlib
import uuid
from types import SimpleNamespace

import pytest

from spacejobs.models.jobs.records import Status
from spacejobs.models.settings import get_settings
from spacejobs.tasks import sweeper


class FakeResults:
    def __init__(self, failing: set[str] = frozenset()) -> None:
        self.deleted: list[str] = []
        self.failing = failing

    def delete(self, key: str) -> None:
        if key in self.failing:
            raise OSError("store unreachable")
        self.deleted.append(key)


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch):
    state = SimpleNamespace(expired=[], due=[], purged={"jobs_deleted": 0, "results_dropped": 0,
                                                       "events_deleted": 0, "dropped_refs": []},
                            audit_deleted=0, transactions=[], folded=0, results=FakeResults(),
                            orphans=[], grace=None, resumed=[], timers=[], timer_calls=0)

    def transaction(engine, *, actor=None):
        state.transactions.append(actor)
        return contextlib.nullcontext("conn")

    def sweep_unsignalled(conn, *, grace, batch):
        state.grace = grace
        return state.due

    def fold_metrics(conn):
        state.folded += 1

    def resume_due_timers(conn, *, batch):
        state.timer_calls += 1
        return state.timers

    def sweep_orphans(engine, store, *, grace):
        state.orphans.append(grace)
        return SimpleNamespace(deleted=2, missing=["a"])

    monkeypatch.setattr(sweeper, "transaction", transaction)
    monkeypatch.setattr(sweeper, "store", SimpleNamespace(
        sweep_expired_leases=lambda conn, batch: state.expired, sweep_unsignalled=sweep_unsignalled,
        resume_due_waits=lambda conn, batch: state.resumed, resume_due_timers=resume_due_timers,
        purge_finished=lambda conn, batch: state.purged, fold_metrics=fold_metrics))
    monkeypatch.setattr(sweeper, "audit", SimpleNamespace(purge=lambda conn, batch: state.audit_deleted))
    monkeypatch.setattr(sweeper, "sweep_orphans", sweep_orphans)
    monkeypatch.setattr(sweeper, "orphan_sweep_due", lambda process: False)
    return state


def process(world, publish=None) -> SimpleNamespace:
    """The worker process the sweep runs as: its engine, publisher, results store, settings."""
    return SimpleNamespace(engine="engine", publisher=SimpleNamespace(wake=publish or Publisher()),
                           results=lambda: world.results, settings=get_settings(),
                           last_orphan_sweep=None)


def ids(n: int) -> list[uuid.UUID]:
    return [uuid.uuid4() for _ in range(n)]


class Publisher:
    def __init__(self, fail_after: int | None = None) -> None:
        self.calls: list[tuple[str, bool]] = []
        self.fail_after = fail_after

    def __call__(self, job_id: str, *, force: bool = False) -> bool:
        self.calls.append((job_id, force))
        return self.fail_after is None or len(self.calls) <= self.fail_after


def test_expired_leases_are_counted_by_what_became_of_them_and_only_requeued_ones_woken(world):
    requeued, failed, cancelled = ids(2), ids(1), ids(3)
    world.expired = ([(j, Status.QUEUED) for j in requeued] + [(j, Status.FAILED) for j in failed]
                     + [(j, Status.CANCELLED) for j in cancelled])
    publish = Publisher()
    report = sweeper.sweep_once(process(world, publish))
    assert (report.requeued, report.failed, report.cancelled) == (2, 1, 3)
    assert publish.calls == [(str(requeued[0]), True)]  # one forced wake-up for the batch
    assert report.wakeups_sent == 1 and report.publish_failures == 0


def test_due_jobs_are_woken_one_wakeup_per_claim_batch(world):
    batch = get_settings().claim_batch
    world.due = [(j, "bench.noop") for j in ids(2 * batch + 1)]
    publish = Publisher()
    report = sweeper.sweep_once(process(world, publish))
    assert report.resignalled == 2 * batch + 1 and report.wakeups_sent == 3
    assert [job_id for job_id, _ in publish.calls] == [
        str(world.due[0][0]), str(world.due[batch][0]), str(world.due[2 * batch][0])]
    assert all(force for _, force in publish.calls)
    assert world.grace == get_settings().wakeup_grace


def test_nothing_due_sends_no_wakeup(world):
    publish = Publisher()
    report = sweeper.sweep_once(process(world, publish))
    assert publish.calls == [] and report.wakeups_sent == 0


def test_a_broker_that_fails_stops_the_round_and_counts_every_job_left_unwoken(world):
    batch = get_settings().claim_batch
    world.expired = [(j, Status.QUEUED) for j in ids(5)]
    world.due = [(j, "bench.noop") for j in ids(3 * batch)]
    publish = Publisher(fail_after=1)
    report = sweeper.sweep_once(process(world, publish))
    assert len(publish.calls) == 2  # the first went through, the second failed: no third try
    assert report.wakeups_sent == 1
    assert report.publish_failures == 5 + 3 * batch - batch


def test_files_of_purged_rows_are_deleted_after_their_commit_and_a_failure_is_left(world):
    world.purged = {"jobs_deleted": 4, "results_dropped": 2, "events_deleted": 9,
                    "dropped_refs": ["o/j/1", "o/j/2", "o/j/3"]}
    world.results = FakeResults(failing={"o/j/2"})
    world.audit_deleted = 6
    report = sweeper.sweep_once(process(world))
    assert (report.jobs_deleted, report.results_dropped, report.events_deleted,
            report.audit_deleted) == (4, 2, 9, 6)
    assert world.results.deleted == ["o/j/1", "o/j/3"] and report.files_deleted == 2
    assert world.folded == 1
    assert set(world.transactions) == {"sweeper"}  # every change is audited as the sweeper's


def test_retention_purges_batch_after_batch_while_they_come_back_full(world, monkeypatch):
    # A steady load above one batch a sweep must not grow the history without bound: full
    # batches are followed by another, each in its own transaction, until one comes back short.
    answers = [{"jobs_deleted": 500, "results_dropped": 0, "events_deleted": 0, "dropped_refs": ["a"]},
               {"jobs_deleted": 0, "results_dropped": 0, "events_deleted": 500, "dropped_refs": []},
               {"jobs_deleted": 120, "results_dropped": 3, "events_deleted": 7, "dropped_refs": ["b"]}]
    monkeypatch.setattr(sweeper.store, "purge_finished", lambda conn, batch: answers.pop(0))
    report = sweeper.sweep_once(process(world))
    assert answers == []
    assert (report.jobs_deleted, report.results_dropped, report.events_deleted) == (620, 3, 507)
    assert world.results.deleted == ["a", "b"]


def test_a_purge_that_never_catches_up_stops_after_its_rounds(world, monkeypatch):
    calls = []

    def full(conn, batch):
        calls.append(batch)
        return {"jobs_deleted": batch, "results_dropped": 0, "events_deleted": 0, "dropped_refs": []}

    monkeypatch.setattr(sweeper.store, "purge_finished", full)
    report = sweeper.sweep_once(process(world))
    assert len(calls) == sweeper.PURGE_ROUNDS
    assert report.jobs_deleted == sweeper.PURGE_ROUNDS * calls[0]


def test_the_orphan_sweep_runs_only_when_due(world, monkeypatch):
    report = sweeper.sweep_once(process(world))
    assert world.orphans == [] and report.orphans_deleted == 0
    monkeypatch.setattr(sweeper, "orphan_sweep_due", lambda process: True)
    report = sweeper.sweep_once(process(world))
    assert world.orphans == [get_settings().results_orphan_grace]
    assert (report.orphans_deleted, report.results_missing) == (2, 1)


def test_the_orphan_sweep_is_due_once_per_interval_per_process(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(sweeper, "time", SimpleNamespace(monotonic=lambda: now[0]))
    interval = get_settings().results_sweep_interval
    one = SimpleNamespace(settings=get_settings(), last_orphan_sweep=None)
    assert sweeper.orphan_sweep_due(one)  # the first sweep of a process
    now[0] += interval - 1
    assert not sweeper.orphan_sweep_due(one)
    now[0] += 1
    assert sweeper.orphan_sweep_due(one)
    assert not sweeper.orphan_sweep_due(one)
    another = SimpleNamespace(settings=get_settings(), last_orphan_sweep=None)
    assert sweeper.orphan_sweep_due(another)  # each process keeps its own time


def test_the_report_lists_every_count_by_name():
    report = sweeper.SweepReport(requeued=1, files_deleted=2)
    assert report.as_dict()["requeued"] == 1 and report.as_dict()["files_deleted"] == 2
    assert set(report.as_dict()) == set(sweeper.SweepReport.__dataclass_fields__)


def test_waiting_jobs_whose_moment_came_are_woken_with_the_rest(world):
    world.resumed = [(j, "bench.wait") for j in ids(2)]
    world.expired = [(j, Status.QUEUED) for j in ids(1)]
    publish = Publisher()
    report = sweeper.sweep_once(process(world, publish))
    assert report.resumed == 2 and report.wakeups_sent == 1  # one batch covers all three
    assert publish.calls == [(str(world.expired[0][0]), True)]


def test_a_round_of_timers_runs_only_their_statement_and_wakes_one_per_claim_batch(world):
    batch = get_settings().claim_batch
    world.timers = [(j, "bench.wait") for j in ids(batch + 1)]
    # What the full sweep would find: a round must leave all of it to the sweep.
    world.expired = [(j, Status.QUEUED) for j in ids(3)]
    world.due = [(j, "bench.noop") for j in ids(2)]
    world.resumed = [(j, "bench.wait") for j in ids(4)]
    publish = Publisher()
    report = sweeper.resume_timers(process(world, publish))
    assert (report.resumed, report.wakeups_sent, report.publish_failures) == (batch + 1, 2, 0)
    assert publish.calls == [(str(world.timers[0][0]), True), (str(world.timers[batch][0]), True)]
    assert world.timer_calls == 1 and world.transactions == ["beat"]
    assert world.folded == 0 and world.grace is None and world.orphans == []


def test_a_round_of_timers_with_the_broker_down_counts_the_jobs_left_unwoken(world, caplog):
    world.timers = [(j, "bench.wait") for j in ids(3)]
    with caplog.at_level("INFO", logger="spacejobs"):
        report = sweeper.resume_timers(process(world, Publisher(fail_after=0)))
    assert (report.resumed, report.wakeups_sent, report.publish_failures) == (3, 0, 3)
    # Counted for beat's line per sweep, not logged four times a second while Redis is down.
    assert caplog.records == []


def test_a_round_with_no_timer_due_sends_nothing(world):
    publish = Publisher()
    report = sweeper.resume_timers(process(world, publish))
    assert report == sweeper.TimersReport() and publish.calls == []
