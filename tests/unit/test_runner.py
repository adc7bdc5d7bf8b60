"""The runner's decisions, against an in-memory store: every outcome of an attempt, what it
writes, and the counts it moves. The integration tests prove the same paths end to end."""

from __future__ import annotations

import json
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg.errors
import pytest

from spacejobs.models.errors import DomainError
from spacejobs.models.jobs.records import Status
from spacejobs.models.kinds import NoParams, job_kind
from spacejobs.models.results.store import LocalResultStore
from spacejobs.tasks.engine.heartbeat import LeaseKeeper
from spacejobs.tasks.engine.runner import (
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


#: what unit.raises raises (set by the test)
TO_RAISE: list[BaseException] = []


@job_kind("unit.raises", org_states={"active"}, max_attempts=3)
def raises(ctx: Any, params: NoParams) -> dict[str, Any]:
    raise TO_RAISE[0]


@job_kind("unit.hard", org_states={"active"}, hard_time_limit=5.0)
def hard_limited(ctx: Any, params: NoParams) -> dict[str, Any]:
    ctx.progress("started")
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

    def __init__(self, *, stop: bool = False, release: bool = False, maximum: int = 100,
                 linger: float = 0.0, wait_for_work: Any = None,
                 clock: Any = time.monotonic) -> None:
        self.leases = FakeLeases()
        self.keeper = LeaseKeeper(self.leases.extend, self.leases.fail, kill=self._killed)
        self.stats = Stats()
        self.results = LocalResultStore(tempfile.mkdtemp(prefix="unit-results-"))
        self.wakes: list[tuple[str | None, float | None]] = []
        self.stop, self.release = stop, release
        self.runner = Runner(
            ports=Ports(self.leases, self.keeper, results=self.results, inline_max_bytes=200),
            signals=Signals(stop_requested=lambda: self.stop, release_due=lambda: self.release,
                            publish_wake=self._wake, fan_out=lambda: self.fanned_out.append(True),
                            wait_for_work=wait_for_work or (lambda seconds: False)),
            tuning=Tuning(BatchSize(maximum), linger=linger), stats=self.stats, clock=clock)
        self.fanned_out: list[bool] = []
        self.kills = 0

    def _wake(self, job_id: str | None = None, *, countdown: float | None = None) -> None:
        self.wakes.append((job_id, countdown))

    def _killed(self) -> None:
        self.kills += 1

    def drain(self, limit: int = 1000) -> int:
        return self.runner.drain(limit)

    def lease(self, kind: str, **row: Any) -> Any:
        """Add a job of ``kind`` and lease it (held by the heartbeat), as a claim would."""
        self.leases.add(kind, **row)
        (job,) = self.leases.finish_and_claim([], claim=1).leased
        self.keeper.hold([job])
        return job

    def one_big_batch(self) -> None:
        """Short jobs seen: the next claim leases two jobs at once, and each after it doubles."""
        self.runner.tuning.batch = BatchSize(10, target=10.0)
        self.runner.tuning.batch.observe(0.001)

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
    TO_RAISE.clear()


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


def test_a_finish_after_the_lease_moved_on_is_discarded():
    h = Harness()
    job = h.leases.add("unit.ok")
    h.steal_before_the_finish()
    h.drain()
    assert h.leases.rows[job].result is None
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

    h.one_big_batch()
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
    from spacejobs.models.errors import CancelRequested, LeaseLost, ReleaseRequested, TimedOut

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


def test_the_heartbeat_thread_wakes_for_a_hard_limit_sooner_than_its_next_tick():
    # A 30-second lease is ticked every 10 s; the running job's 0.2 s hard limit comes first,
    # and the thread, asleep until that tick, must be woken for it.
    leases = FakeLeases()
    killed = threading.Event()
    keeper = LeaseKeeper(leases.extend, leases.fail, kill=killed.set)
    job_id = leases.add("unit.ok")
    (job,) = leases.finish_and_claim([], claim=1).leased
    keeper.hold([job])
    time.sleep(0.1)  # the thread is asleep until the lease's tick
    keeper.running(job, HardLimited(retry_on_timeout=False, hard_time_limit=0.2),
                   started=time.monotonic())
    assert killed.wait(3)
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
    assert not keeper.flags(kept.id).lost and not keeper.flags(kept.id).cancel
    assert keeper.flags(lost.id).lost
    assert keeper.flags(cancelled.id).cancel
    assert keeper.interval() == 10.0  # a third of the 30-second lease


def test_a_job_running_past_the_cancel_check_learns_of_its_cancel_without_waiting_for_a_tick():
    leases = FakeLeases()
    now = [100.0]
    asked: list[list] = []

    def cancels_asked(ids: list) -> set:
        asked.append(ids)
        return {i for i in ids if leases.rows[i].status == Status.CANCEL_REQUESTED}

    keeper = LeaseKeeper(leases.extend, leases.fail, cancels_asked=cancels_asked,
                         cancel_check=0.5, kill=lambda: None, clock=lambda: now[0])
    other_id = leases.add("unit.ok")
    job_id = leases.add("unit.ok")
    report = leases.finish_and_claim([], claim=2)
    held = {job.id: job for job in report.leased}
    keeper.hold(report.leased)
    keeper.running(held[job_id], HardLimited(retry_on_timeout=False, hard_time_limit=0),
                   started=now[0])
    leases.rows[job_id].status = Status.CANCEL_REQUESTED
    leases.rows[other_id].status = Status.CANCEL_REQUESTED
    keeper.check_cancel()
    # Only the running job is looked at, and its flag is set; the held one learns at its start.
    assert asked == [[job_id]]
    assert keeper.flags(job_id).cancel and not keeper.flags(other_id).cancel
    assert not keeper.flags(job_id).lost


def test_a_job_shorter_than_the_cancel_check_costs_no_cancel_check():
    leases = FakeLeases()
    asked: list[list] = []
    keeper = LeaseKeeper(leases.extend, leases.fail, cancels_asked=lambda ids: asked.append(ids) or set(),
                         cancel_check=0.3, kill=lambda: None)
    for _ in range(20):
        leases.add("unit.ok")
    report = leases.finish_and_claim([], claim=20)
    keeper.hold(report.leased)  # the thread runs: it is what would look
    for job in report.leased:
        keeper.running(job, HardLimited(retry_on_timeout=False, hard_time_limit=0),
                       started=time.monotonic())
        time.sleep(0.005)
        keeper.idle()
    time.sleep(0.4)
    assert asked == []
    job = report.leased[0]
    keeper.running(job, HardLimited(retry_on_timeout=False, hard_time_limit=0),
                   started=time.monotonic())
    deadline = time.monotonic() + 5
    while not asked and time.monotonic() < deadline:
        time.sleep(0.05)
    keeper.idle()
    assert asked and asked[0] == [job.id]


def test_a_failed_heartbeat_says_what_failed_and_never_what_the_error_said(caplog):
    leases = FakeLeases()
    leases.add("unit.ok")

    def extend(_leases: object) -> dict:
        raise psycopg.errors.QueryCanceled(UNSAFE_MESSAGE)

    keeper = LeaseKeeper(extend, leases.fail, kill=lambda: None)
    held = leases.finish_and_claim([], claim=1).leased
    keeper.hold(held)
    try:
        with caplog.at_level("WARNING", logger="spacejobs.heartbeat"):
            keeper.tick()
    finally:
        # Its thread ticks as long as this test process lives: holding nothing, it extends
        # nothing (holding the job, it logged this warning into every later test's output).
        keeper.drop(job.id for job in held)
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


# ------------------------------------------------------- one attempt: its decision table

@dataclass(frozen=True)
class Ending:
    """One row of the attempt's decision table, as a test case: what the kind raised, what
    the table decides, how the attempt ends and what the job row says after it."""

    raised: BaseException
    action: Action
    outcome: Outcome
    status: Status
    error_code: str | None = None
    cancel_asked: bool = False  # the user asked to cancel while it ran


def _endings() -> list[Ending]:
    from spacejobs.models.errors import CancelRequested, LeaseLost, ReleaseRequested, WaitRequested

    return [
        Ending(LeaseLost(), Action.NOTHING, Outcome.LEASE_LOST, Status.LEASED),
        Ending(ReleaseRequested(), Action.RELEASE, Outcome.RELEASED, Status.QUEUED),
        Ending(CancelRequested(), Action.ACKNOWLEDGE_CANCEL, Outcome.CANCELLED, Status.CANCELLED,
               cancel_asked=True),
        Ending(Refused(), Action.FAIL, Outcome.FAILED, Status.FAILED, "not_today"),
        Ending(Flaky(), Action.FAIL, Outcome.RETRY, Status.QUEUED, "flaky"),
        Ending(Refused(), Action.FAIL, Outcome.CANCELLED, Status.CANCELLED, "not_today",
               cancel_asked=True),
        Ending(KeyError(UNSAFE_MESSAGE), Action.FAIL_INTERNAL, Outcome.RETRY, Status.QUEUED,
               "internal_error"),
        Ending(WaitRequested(signal="approved"), Action.WAIT, Outcome.WAITING, Status.WAITING),
        # asked to cancel while it ran: the wait acknowledges the cancel instead
        Ending(WaitRequested(children=2), Action.WAIT, Outcome.CANCELLED, Status.CANCELLED,
               cancel_asked=True),
    ]


@pytest.mark.parametrize("ending", _endings(), ids=lambda e: f"{type(e.raised).__name__}-{e.outcome}")
def test_each_exception_a_kind_raises_ends_the_attempt_as_the_table_says(ending: Ending):
    h = Harness()
    job = h.lease("unit.raises")
    if ending.cancel_asked:
        h.leases.rows[job.id].status = Status.CANCEL_REQUESTED
    if ending.outcome is Outcome.LEASE_LOST:
        h.leases.steal(job.id)
    ended: list[Outcome] = []
    original_end = h.runner.ends.end
    h.runner.ends.end = lambda job, outcome, seconds=0.0: (  # type: ignore[method-assign]
        ended.append(outcome), original_end(job, outcome, seconds))
    TO_RAISE.append(ending.raised)

    assert action_for(ending.raised) is ending.action
    assert h.runner.attempt.run(job, ok_kind("unit.raises")) is None  # nothing to finish
    row = h.leases.rows[job.id]
    assert ended == [ending.outcome]
    assert (row.status, row.error_code) == (ending.status, ending.error_code)
    assert h.keeper.held == 0 and h.stats.running == 0
    assert bool(row.diagnostics) is (ending.action is Action.FAIL_INTERNAL)


def test_the_table_cases_cover_every_decision():
    assert {e.action for e in _endings()} | {Action.FINISH} == set(Action)


def test_a_job_that_returned_is_handed_to_the_buffer_not_written():
    h = Harness()
    job = h.lease("unit.ok")
    finished = h.runner.attempt.run(job, ok_kind("unit.ok"))
    assert finished is not None and finished.result == {"ok": True}
    assert h.leases.status(job.id) == Status.LEASED  # the batched finish writes it
    assert h.keeper.held == 1  # its lease is kept alive until then


def test_a_cancel_noticed_before_the_start_never_runs_the_kind():
    h = Harness()
    job = h.lease("unit.ok")
    h.leases.rows[job.id].status = Status.CANCEL_REQUESTED
    h.keeper.tick()  # the heartbeat learns of it while the job waits in the batch
    assert h.runner.attempt.run(job, ok_kind("unit.ok")) is None
    assert SEEN == [] and h.leases.status(job.id) == Status.CANCELLED


def ok_kind(name: str) -> Any:
    from spacejobs.models.kinds import get_any_kind

    return get_any_kind(name)


# ------------------------------------------------- the worker's log of a kind's exception

def test_a_kind_that_raises_leaves_its_traceback_in_the_worker_log_without_its_message(caplog):
    from spacejobs.models.logs import ContextFormatter

    h = Harness()
    h.leases.add("unit.crash")
    with caplog.at_level("INFO", logger="spacejobs.runner"):
        h.drain(limit=1)
    [raised] = [r for r in caplog.records if r.exc_info]
    assert raised.levelname == "ERROR"
    assert raised.getMessage() == "job raised builtins.ZeroDivisionError"
    source = Path(__file__).read_text().splitlines()
    raise_line = source.index("    raise ZeroDivisionError(UNSAFE_MESSAGE)") + 1
    for as_json in (False, True):
        line = ContextFormatter(as_json=as_json).format(raised)
        for useful in ("test_runner.py", f"line {raise_line}, in crash",
                       "raise ZeroDivisionError(UNSAFE_MESSAGE)",
                       "builtins.ZeroDivisionError (message withheld)", "unit.crash"):
            assert useful in line, (useful, as_json)
        assert "tenant-4711" not in line


def test_a_domain_error_is_the_kinds_own_answer_and_logs_no_traceback(caplog):
    h = Harness()
    h.leases.add("unit.refused")
    with caplog.at_level("INFO", logger="spacejobs.runner"):
        h.drain()
    assert [r for r in caplog.records if r.exc_info] == []
    assert "job attempt failed with not_today; now failed" in caplog.text


# ------------------------------------------------------ the buffer of finished results

class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _buffer(h: Harness, clock: FakeClock) -> Any:
    from spacejobs.tasks.engine.finishes import FinishBuffer

    return FinishBuffer(h.runner.ports, h.runner.ends, clock=clock, flush_after=0.005)


def test_the_buffer_asks_for_a_flush_once_a_result_waited_or_before_a_hard_limited_job():
    from spacejobs.tasks.engine.leases import Finished

    h, clock = Harness(), FakeClock()
    buffer = _buffer(h, clock)
    ok, hard = ok_kind("unit.ok"), ok_kind("unit.hard")
    assert not buffer.due_before(hard)  # nothing waits: nothing to flush
    job = h.lease("unit.ok")
    buffer.add(Finished(job, ok.rules, {"ok": True}))
    clock.now += 0.004
    assert not buffer.due_before(ok)  # young enough to ride on the next claim
    assert buffer.due_before(hard)  # the heartbeat may kill the process under a hard limit
    assert not buffer.due_before(None)
    clock.now += 0.002
    assert buffer.due_before(ok)  # waited too long: flushed alone
    report = buffer.flush()
    assert report.completed == [job] and not buffer
    assert h.leases.calls[-1] == "finish_and_claim(1, claim=0)"


def test_a_flush_that_fails_ends_every_pending_attempt_as_crashed_and_raises():
    from spacejobs.tasks.engine.leases import Finished

    h = Harness()
    buffer = _buffer(h, FakeClock())
    jobs = [h.lease("unit.ok") for _ in range(2)]
    for job in jobs:
        buffer.add(Finished(job, ok_kind("unit.ok").rules, {"ok": True}))
    h.leases.broken = True
    with pytest.raises(ConnectionError):
        buffer.flush()
    assert not buffer and h.keeper.held == 0
    assert (h.stats.processed, h.stats.failed) == (2, 2)
    assert [h.leases.status(j.id) for j in jobs] == [Status.LEASED] * 2  # they expire, run again


def test_a_result_is_flushed_alone_before_a_hard_limited_job_of_the_same_batch_starts():
    h = Harness()
    done, _hard = h.leases.add("unit.ok"), h.leases.add("unit.hard")
    h.one_big_batch()
    h.drain()
    assert h.leases.calls == ["finish_and_claim(0, claim=2)",  # both, in one batch
                              "record_progress",  # unit.ok ran
                              "finish_and_claim(1, claim=0)",  # its result, alone...
                              "record_progress",  # ...before unit.hard started
                              "finish_and_claim(1, claim=4)"]
    assert h.leases.status(done) == Status.COMPLETED


# ------------------------------------------------------------------------------ the loop

def test_the_loop_lingers_for_new_work_and_drains_what_came():
    waits: list[float] = []

    def a_job_arrives(seconds: float) -> bool:
        waits.append(seconds)
        if len(waits) == 1:
            h.leases.add("unit.ok")
            return True
        return False

    h = Harness(linger=0.5, wait_for_work=a_job_arrives)
    h.leases.add("unit.ok")
    assert h.drain() == 2
    assert waits == [0.5, 0.5]  # it waited again after the second drain, and nothing came
    assert all(row.status == Status.COMPLETED for row in h.leases.rows.values())


def test_a_stopping_worker_does_not_linger():
    waits: list[float] = []
    h = Harness(stop=True, linger=0.5, wait_for_work=lambda s: waits.append(s) or True)
    h.leases.add("unit.ok")
    assert h.drain() == 0 and waits == []
    assert h.leases.calls == []  # nothing pending, nothing wanted: not even a claim


def test_a_claim_that_met_only_locked_jobs_looks_again_shortly(monkeypatch):
    import spacejobs.tasks.engine.runner

    pauses: list[float] = []
    monkeypatch.setattr(spacejobs.tasks.engine.runner.time, "sleep", pauses.append)
    h = Harness()
    job = h.leases.add("unit.ok")
    original = h.leases.finish_and_claim
    claims = []

    def locked_at_first(finished: Any, **kwargs: Any) -> Any:
        claims.append(kwargs["claim"])
        if len(claims) == 1:  # another process's claim holds the row's lock for a moment
            report = original(finished, claim=0)
            report.more_due = True
            return report
        return original(finished, **kwargs)

    h.leases.finish_and_claim = locked_at_first  # type: ignore[method-assign]
    assert h.drain() == 1
    assert pauses == [0.005] and h.leases.status(job) == Status.COMPLETED
