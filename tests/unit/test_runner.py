"""The runner's decisions, against an in-memory store: every outcome of an attempt, what it
writes, and the counts it moves. The integration tests prove the same paths end to end."""

from __future__ import annotations

import json
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg.errors
import pytest

from models.errors import DomainError
from models.jobs.records import Status
from models.kinds import NoParams, job_kind
from models.ops.counters import STALE_FINISHES
from models.results.store import LocalResultStore
from tasks.heartbeat import LeaseKeeper
from tasks.runner import (
    ON_EXCEPTION,
    Action,
    BatchSize,
    Outcome,
    Ports,
    Runner,
    Signals,
    Stats,
    Tuning,
    action_for,
)
from tests.unit.fake_leases import FakeLeases, FakeStanding

SEEN: list[str] = []


class Refused(DomainError):
    code = "not_today"
    message = "Not today."


class Flaky(DomainError):
    code = "flaky"
    message = "Try again."
    permanent = False


@job_kind("unit.ok", org_states={"active"})
def ok(ctx: Any, params: NoParams) -> dict[str, Any]:
    SEEN.append("unit.ok")
    ctx.progress("counted", done=1, total=1)
    return {"ok": True}


@job_kind("unit.refused", org_states={"active"})
def refused(ctx: Any, params: NoParams) -> dict[str, Any]:
    raise Refused()


@job_kind("unit.flaky", org_states={"active"}, max_attempts=3, backoff=2.0)
def flaky(ctx: Any, params: NoParams) -> dict[str, Any]:
    raise Flaky()


@job_kind("unit.crash", org_states={"active"}, max_attempts=2, backoff=1.0)
def crash(ctx: Any, params: NoParams) -> dict[str, Any]:
    raise ZeroDivisionError(UNSAFE_MESSAGE)


#: what unit.crash's exception says: it may hold anything, so operators never see it
UNSAFE_MESSAGE = "not a safe message: tenant-4711"


@job_kind("unit.checkpoint", org_states={"active"})
def checkpoint(ctx: Any, params: NoParams) -> dict[str, Any]:
    SEEN.append("unit.checkpoint")
    ctx.checkpoint()
    return {"reached": "the end"}


@job_kind("unit.tenant", org_states={"active"}, role="admin")
def tenant(ctx: Any, params: NoParams) -> dict[str, Any]:
    with ctx.tenant():
        pass
    return {}


ARCHIVE = b"PK\x03\x04 not really a zip"


@job_kind("unit.file", org_states={"active"})
def stores_a_file(ctx: Any, params: NoParams) -> Any:
    return ctx.store_result(ARCHIVE, content_type="application/zip", filename="out.zip")


@job_kind("unit.file_then_fail", org_states={"active"}, max_attempts=1)
def stores_then_fails(ctx: Any, params: NoParams) -> Any:
    ctx.store_result(ARCHIVE, content_type="application/zip", filename="out.zip")
    raise Refused()


@job_kind("unit.two_files", org_states={"active"})
def stores_two_returns_one(ctx: Any, params: NoParams) -> Any:
    ctx.store_result(b"draft", content_type="text/plain", filename="draft.txt")
    return ctx.store_result(ARCHIVE, content_type="application/zip", filename="final.zip")


@job_kind("unit.big", org_states={"active"})
def returns_a_large_json(ctx: Any, params: NoParams) -> dict[str, Any]:
    return {"rows": ["x" * 50] * 10}  # over the harness's 200-byte threshold


class Harness:
    """A runner over a FakeLeases, with the wake-ups and counters it publishes recorded."""

    def __init__(self, *, stop: bool = False, release: bool = False, maximum: int = 100) -> None:
        self.leases = FakeLeases()
        self.keeper = LeaseKeeper(self.leases.extend, self.leases.fail, kill=self._killed)
        self.stats = Stats()
        self.results = LocalResultStore(tempfile.mkdtemp(prefix="unit-results-"))
        self.wakes: list[tuple[str | None, float | None]] = []
        self.counted: list[tuple[str, str]] = []
        self.stop, self.release = stop, release
        self.runner = Runner(
            ports=Ports(self.leases, self.keeper, results=self.results, inline_max_bytes=200,
                        count=lambda name, kind: self.counted.append((name, kind))),
            signals=Signals(stop_requested=lambda: self.stop, release_due=lambda: self.release,
                            publish_wake=self._wake, fan_out=lambda: self.fanned_out.append(True)),
            tuning=Tuning(BatchSize(maximum)), stats=self.stats)
        self.fanned_out: list[bool] = []
        self.kills = 0

    def _wake(self, job_id: str | None = None, *, countdown: float | None = None) -> None:
        self.wakes.append((job_id, countdown))

    def _killed(self) -> None:
        self.kills += 1

    def drain(self, limit: int = 1000) -> int:
        return self.runner.drain(limit)

    def files(self) -> list[str]:
        return [found.key for found in self.results.list()]

    def before_each_finish(self, act: Any) -> None:
        """Run ``act(finished)`` just before the batched finish commits (when it has any)."""
        original = self.leases.finish_and_claim

        def acting_first(finished: Any, **kwargs: Any) -> Any:
            if finished:
                act(finished)
            return original(finished, **kwargs)

        self.leases.finish_and_claim = acting_first  # type: ignore[method-assign]

    def steal_before_the_finish(self) -> None:
        self.before_each_finish(lambda finished: [self.leases.steal(f.job.id) for f in finished])

    def remove_member_before_the_finish(self, job: Any) -> None:
        self.before_each_finish(lambda finished: self.leases.members.pop(job))


@pytest.fixture(autouse=True)
def _forget_seen() -> None:
    SEEN.clear()


def test_a_job_that_returns_is_completed_with_its_result_and_counted():
    h = Harness()
    job = h.leases.add("unit.ok")
    assert h.drain() == 1
    row = h.leases.rows[job]
    assert (row.status, row.result, row.progress) == (Status.COMPLETED, {"ok": True},
                                                       {"stage": "counted", "done": 1, "total": 1})
    assert (h.stats.processed, h.stats.failed, h.stats.running) == (1, 0, 0)
    assert h.keeper.held == 0


def test_a_domain_error_fails_the_job_at_once_with_its_code():
    h = Harness()
    job = h.leases.add("unit.refused")
    h.drain()
    assert (h.leases.status(job), h.leases.rows[job].error_code) == (Status.FAILED, "not_today")
    assert h.leases.rows[job].diagnostics == []  # a domain error is not an internal failure
    assert (h.stats.processed, h.stats.failed) == (1, 1)


def test_a_transient_domain_error_goes_back_to_the_queue_with_a_delayed_wake_up():
    h = Harness()
    job = h.leases.add("unit.flaky")
    h.drain(limit=1)
    assert h.leases.status(job) == Status.QUEUED and h.leases.rows[job].attempts == 1
    (job_id, countdown), *_ = h.wakes
    assert job_id == str(job) and 1.0 <= countdown <= 2.0  # first backoff: half fixed, half random


def test_an_unexpected_exception_is_an_internal_error_with_operator_only_detail():
    h = Harness()
    job = h.leases.add("unit.crash")
    h.drain(limit=1)
    row = h.leases.rows[job]
    assert (row.status, row.error_code) == (Status.QUEUED, "internal_error")
    [diagnosis] = row.diagnostics
    assert diagnosis.exception_class == "builtins.ZeroDivisionError"
    # Where it failed, for operators; never what the exception said.
    assert "test_runner.py" in diagnosis.traceback
    assert "in crash\n    raise ZeroDivisionError(UNSAFE_MESSAGE)" in diagnosis.traceback
    assert "tenant-4711" not in diagnosis.traceback


def test_the_last_attempt_fails_the_job_for_good():
    h = Harness()
    job = h.leases.add("unit.crash", attempts=1, max_attempts=2)
    h.drain()
    assert (h.leases.status(job), h.leases.rows[job].attempts) == (Status.FAILED, 2)
    assert h.wakes == []


def test_a_cancel_seen_by_the_heartbeat_stops_the_job_at_its_checkpoint():
    h = Harness()
    job = h.leases.add("unit.checkpoint")
    original = h.leases.finish_and_claim

    def claim_then_cancel(*args: Any, **kwargs: Any) -> Any:
        report = original(*args, **kwargs)
        for leased in report.leased:
            h.leases.rows[leased.id].status = Status.CANCEL_REQUESTED  # the user asked
        return report

    h.leases.finish_and_claim = claim_then_cancel  # type: ignore[method-assign]
    h.keeper.hold = lambda jobs: (LeaseKeeper.hold(h.keeper, jobs), h.keeper.tick())  # type: ignore[method-assign]
    h.drain()
    assert h.leases.status(job) == Status.CANCELLED
    assert SEEN == []  # it never started: cancelled before it ran
    assert h.stats.failed == 0


def test_a_lease_lost_to_a_newer_attempt_writes_nothing():
    h = Harness()
    job = h.leases.add("unit.checkpoint")
    original = h.leases.finish_and_claim

    def claim_then_steal(*args: Any, **kwargs: Any) -> Any:
        report = original(*args, **kwargs)
        for leased in report.leased:
            h.leases.steal(leased.id)
        h.keeper.hold(report.leased)
        h.keeper.tick()  # the heartbeat finds the lease gone
        return report

    h.leases.finish_and_claim = claim_then_steal  # type: ignore[method-assign]
    h.drain(limit=1)
    row = h.leases.rows[job]
    assert (row.status, row.result) == (Status.LEASED, None)  # the newer attempt's, untouched
    assert (h.stats.processed, h.stats.failed) == (1, 1)


def test_a_finish_after_the_lease_moved_on_is_discarded_and_counted():
    h = Harness()
    job = h.leases.add("unit.ok")
    h.steal_before_the_finish()
    h.drain()
    assert h.leases.rows[job].result is None
    assert h.counted == [(STALE_FINISHES, "unit.ok")]
    assert h.stats.failed == 1


def test_a_requester_removed_before_the_finish_fails_the_job_instead_of_completing_it():
    h = Harness()
    job = h.leases.add("unit.ok")
    h.remove_member_before_the_finish(job)
    h.drain()
    row = h.leases.rows[job]
    assert (row.status, row.error_code, row.result) == (Status.FAILED, "requester_not_member", None)


def test_the_tenant_transaction_re_checks_the_kinds_role():
    h = Harness()
    job = h.leases.add("unit.tenant")
    h.leases.members[job] = FakeStanding(role="member")
    h.drain()
    assert (h.leases.status(job), h.leases.rows[job].error_code) == (Status.FAILED,
                                                                      "insufficient_role")


def test_a_kind_this_worker_does_not_know_fails_and_says_so():
    h = Harness()
    job = h.leases.add("unit.nobody-knows-me")
    h.drain()
    assert (h.leases.status(job), h.leases.rows[job].error_code) == (Status.FAILED, "unknown_kind")


def test_at_shutdown_held_jobs_are_given_back_unstarted_without_burning_an_attempt():
    h = Harness()
    jobs = [h.leases.add("unit.checkpoint") for _ in range(3)]
    original = h.leases.finish_and_claim

    def stop_after_claim(*args: Any, **kwargs: Any) -> Any:
        report = original(*args, **kwargs)
        h.stop = True  # SIGTERM arrives while the batch is held
        return report

    h.runner.tuning.batch = BatchSize(10, target=10.0)
    h.runner.tuning.batch.observe(0.001)  # short jobs: claim the whole batch
    h.leases.finish_and_claim = stop_after_claim  # type: ignore[method-assign]
    assert h.drain() == 0
    assert [h.leases.status(j) for j in jobs] == [Status.QUEUED] * 3
    assert [h.leases.rows[j].attempts for j in jobs] == [0, 0, 0]
    assert SEEN == [] and h.wakes == [(None, None)]  # another worker is told at once


def test_a_running_job_past_the_grace_period_is_given_back_at_its_checkpoint():
    h = Harness(release=True)
    job = h.leases.add("unit.checkpoint")
    h.drain()
    assert (h.leases.status(job), h.leases.rows[job].attempts) == (Status.QUEUED, 0)
    assert h.stats.failed == 0


def test_finishes_are_committed_with_the_next_claim_and_batches_grow():
    h = Harness()
    jobs = [h.leases.add("unit.ok") for _ in range(15)]
    assert h.drain() == 15
    assert all(h.leases.status(j) == Status.COMPLETED for j in jobs)
    claims = [c for c in h.leases.calls if c.startswith("finish_and_claim")]
    # 1, 2, 4, 8 jobs per claim; each claim after the first also commits the previous batch.
    assert claims[:5] == ["finish_and_claim(0, claim=1)", "finish_and_claim(1, claim=2)",
                          "finish_and_claim(2, claim=4)", "finish_and_claim(4, claim=8)",
                          "finish_and_claim(8, claim=16)"]
    assert len(claims) == 5


def test_a_full_batch_tells_one_more_process_once_and_a_lone_job_tells_nobody():
    h = Harness()
    h.leases.add("unit.ok")
    h.drain()
    assert h.fanned_out == []  # the claim asked for 1 and found 1, then found nothing more...
    h = Harness()
    for _ in range(10):
        h.leases.add("unit.ok")
    h.drain()
    assert h.fanned_out == [True]  # ...but a backlog is shared, once per drain


def test_a_drain_stopped_by_its_limit_wakes_another_to_go_on():
    h = Harness()
    for _ in range(5):
        h.leases.add("unit.ok")
    assert h.drain(limit=3) == 3
    assert h.wakes == [(None, None)]
    assert sum(r.status == Status.QUEUED for r in h.leases.rows.values()) == 2


def test_a_failure_that_cannot_be_recorded_leaves_the_lease_to_expire():
    h = Harness()
    job = h.leases.add("unit.refused")
    original_fail = h.leases.fail

    def database_gone(*args: Any) -> Any:
        h.leases.broken = True
        try:
            return original_fail(*args)
        finally:
            h.leases.broken = False

    h.leases.fail = database_gone  # type: ignore[method-assign]
    h.drain()
    assert h.leases.status(job) == Status.LEASED  # the sweeper takes over when it expires
    assert (h.stats.processed, h.stats.failed) == (1, 1)


def test_every_exception_maps_to_exactly_one_action():
    from models.errors import CancelRequested, LeaseLost, ReleaseRequested, TimedOut

    assert action_for(LeaseLost()) is Action.NOTHING
    assert action_for(ReleaseRequested()) is Action.RELEASE
    assert action_for(CancelRequested()) is Action.ACKNOWLEDGE_CANCEL
    assert action_for(TimedOut()) is Action.FAIL
    assert action_for(KeyError("x")) is Action.FAIL_INTERNAL
    assert action_for(None) is Action.FINISH  # it returned
    assert ON_EXCEPTION[-1] == (Exception, Action.FAIL_INTERNAL)  # the catch-all comes last
    assert {o.value for o in Outcome} >= {"completed", "retry", "failed", "cancelled", "released",
                                          "lease_lost", "stale_finish_discarded", "crashed"}


def test_batch_size_starts_at_one_doubles_and_shrinks_for_long_jobs():
    batch = BatchSize(64, target=0.05)
    assert batch.next(1000) == 1
    for _ in range(3):
        batch.observe(0.0001)
    assert [batch.next(1000) for _ in range(8)] == [2, 4, 8, 16, 32, 64, 64, 64]
    assert batch.next(10) == 10  # never more than the drain has left
    for _ in range(30):
        batch.observe(2.0)  # long jobs: one at a time
    assert batch.next(1000) == 1


@dataclass
class HardLimited:
    """The rules the heartbeat reads of a running job: a hard limit of 5 s."""

    retry_on_timeout: bool
    hard_time_limit: float = 5.0

    @staticmethod
    def backoff(attempt: int) -> float:
        return 0.0


def test_the_heartbeat_kills_a_job_past_its_hard_time_limit_after_recording_it():
    leases = FakeLeases()
    killed = []
    now = [100.0]
    keeper = LeaseKeeper(leases.extend, leases.fail, kill=lambda: killed.append(True),
                         clock=lambda: now[0])
    job_id = leases.add("unit.ok")
    report = leases.finish_and_claim([], claim=1)
    (job,) = report.leased

    # Not held, so no heartbeat thread ticks beside the test's own calls.
    keeper.running(job, HardLimited(retry_on_timeout=False), started=now[0])
    keeper.tick()
    assert killed == [] and leases.status(job_id) == Status.LEASED
    now[0] += 6
    keeper.tick()
    assert killed == [True]
    assert (leases.status(job_id), leases.rows[job_id].error_code) == (Status.FAILED, "timed_out")


def test_two_ticks_at_once_past_the_hard_limit_record_the_timeout_and_kill_only_once():
    # The heartbeat thread and a caller can tick together; a slow clock widens the window
    # between "past the limit?" and "forget the running job" that they must not both pass.
    leases = FakeLeases()
    killed = []
    now = [100.0]

    def slow_clock() -> float:
        time.sleep(0.01)
        return now[0]

    keeper = LeaseKeeper(leases.extend, leases.fail, kill=lambda: killed.append(True),
                         clock=slow_clock)
    leases.add("unit.ok")
    (job,) = leases.finish_and_claim([], claim=1).leased

    keeper.running(job, HardLimited(retry_on_timeout=True), started=now[0])
    now[0] += 6
    start = threading.Barrier(8)

    def tick() -> None:
        start.wait()
        keeper.tick()

    threads = [threading.Thread(target=tick) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert killed == [True]
    assert [c for c in leases.calls if c.startswith("fail")] == ["fail(timed_out)"]


def test_the_heartbeat_extends_every_held_lease_in_one_call_and_notes_the_lost_ones():
    leases = FakeLeases()
    for _ in range(3):
        leases.add("unit.ok")
    report = leases.finish_and_claim([], claim=3)
    keeper = LeaseKeeper(leases.extend, leases.fail, kill=lambda: None)
    keeper.hold(report.leased)
    kept, lost, cancelled = report.leased
    leases.steal(lost.id)
    leases.rows[cancelled.id].status = Status.CANCEL_REQUESTED
    keeper.tick()
    assert [c for c in leases.calls if c.startswith("extend")] == ["extend(3)"]
    assert not keeper.flags(kept.id).lost.is_set() and not keeper.flags(kept.id).cancel.is_set()
    assert keeper.flags(lost.id).lost.is_set()
    assert keeper.flags(cancelled.id).cancel.is_set()
    assert keeper.interval() == 10.0  # a third of the 30-second lease


def test_a_failed_heartbeat_says_what_failed_and_never_what_the_error_said(caplog):
    leases = FakeLeases()
    leases.add("unit.ok")

    def extend(_leases: object) -> dict:
        raise psycopg.errors.QueryCanceled(UNSAFE_MESSAGE)

    keeper = LeaseKeeper(extend, leases.fail, kill=lambda: None)
    keeper.hold(leases.finish_and_claim([], claim=1).leased)
    with caplog.at_level("WARNING", logger="spacejobs.heartbeat"):
        keeper.tick()
    assert [r.getMessage() for r in caplog.records] == [
        "lease heartbeat failed (psycopg.errors.QueryCanceled (SQLSTATE 57014 query_canceled));"
        " will retry"]


# ------------------------------------------------------------------------- stored results

def test_a_file_the_kind_stored_is_what_the_finish_records():
    h = Harness()
    job = h.leases.add("unit.file")
    h.drain()
    row = h.leases.rows[job]
    assert row.status == Status.COMPLETED and h.files() == [row.result_ref]
    assert row.result == {"stored": {"content_type": "application/zip", "filename": "out.zip",
                                     "size": len(ARCHIVE), "form": "file"}}
    assert b"".join(h.results.open(row.result_ref).chunks()) == ARCHIVE
    assert row.result_ref.startswith(f"{row.organization_id}/{job}/")


def test_a_large_json_result_goes_to_the_store_and_a_small_one_stays_inline():
    h = Harness()
    big, small = h.leases.add("unit.big"), h.leases.add("unit.ok")
    h.drain()
    stored = h.leases.rows[big]
    assert stored.result["stored"]["form"] == "json" and h.files() == [stored.result_ref]
    assert json.loads(b"".join(h.results.open(stored.result_ref).chunks())) == {"rows": ["x" * 50] * 10}
    assert (h.leases.rows[small].result, h.leases.rows[small].result_ref) == ({"ok": True}, None)


def test_a_stale_finish_deletes_its_file():
    h = Harness()
    job = h.leases.add("unit.file")
    written: list[list[str]] = []
    h.before_each_finish(lambda finished: written.append(h.files()))
    h.steal_before_the_finish()
    h.drain()
    assert [len(files) for files in written] == [1]  # the file was there before the finish
    assert h.leases.rows[job].result_ref is None
    assert h.files() == []
    assert h.counted == [(STALE_FINISHES, "unit.file")]


def test_a_finish_refused_for_a_removed_requester_deletes_its_file():
    h = Harness()
    job = h.leases.add("unit.file")
    h.remove_member_before_the_finish(job)
    h.drain()
    assert h.leases.status(job) == Status.FAILED and h.files() == []


def test_an_attempt_that_raises_after_storing_leaves_no_file():
    h = Harness()
    job = h.leases.add("unit.file_then_fail")
    h.drain()
    assert h.leases.status(job) == Status.FAILED and h.files() == []


def test_a_file_stored_but_not_returned_is_deleted():
    h = Harness()
    job = h.leases.add("unit.two_files")
    h.drain()
    row = h.leases.rows[job]
    assert row.result["stored"]["filename"] == "final.zip" and h.files() == [row.result_ref]


def test_a_finish_whose_commit_is_unknown_leaves_the_file_to_the_orphan_sweep():
    h = Harness()
    h.leases.add("unit.file")
    original = h.leases.finish_and_claim

    def connection_lost(finished: Any, **kwargs: Any) -> Any:
        if finished:
            raise ConnectionError("the commit may or may not have happened")
        return original(finished, **kwargs)

    h.leases.finish_and_claim = connection_lost  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        h.drain()
    # Deleting it could break a job that did complete: only the rows can tell.
    assert len(h.files()) == 1
