"""Jobs a batch holds behind a long one are given back (tasks/engine/held.py): the runner against
the in-memory leases, the watch looked through by hand on a fake clock where a test says when,
and with its real thread where the race between the give-back and the drain is the point.
tests/integration/test_side_by_side.py shows the same with real worker processes."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from uuid import UUID

import pytest

from spacejobs.models.jobs.records import LeasedJob, Status
from spacejobs.models.kinds import NoParams, job_kind
from spacejobs.tasks.engine.held import GIVE_BACK_AFTER, HeldJobs, LongJobWatch
from spacejobs.tasks.engine.runner import BatchSize
from tests.unit.test_runner import FakeClock, Harness

#: the jobs' ids in the order their kinds ran
ran_jobs: list[UUID] = []
#: what unit.long does while it runs, set by each test: the world moves on meanwhile
WHILE_LONG: list[Callable[[], object]] = []


@job_kind("unit.long", org_states={"active"})
def long_job(ctx: Any, params: NoParams) -> dict[str, Any]:
    ran_jobs.append(ctx.job.id)
    for act in WHILE_LONG:
        act()
    return {}


@job_kind("unit.short", org_states={"active"})
def short_job(ctx: Any, params: NoParams) -> dict[str, Any]:
    ran_jobs.append(ctx.job.id)
    return {}


@job_kind("unit.a_millisecond", org_states={"active"})
def a_millisecond(ctx: Any, params: NoParams) -> dict[str, Any]:
    ran_jobs.append(ctx.job.id)
    time.sleep(0.001)
    return {}


@pytest.fixture(autouse=True)
def _forget_runs() -> None:
    ran_jobs.clear()
    WHILE_LONG.clear()


def watched_harness(clock: Any = time.monotonic, *, first_batch: int = 2,
                    after: float = GIVE_BACK_AFTER) -> tuple[Harness, LongJobWatch]:
    """A runner with a watch, warm from short jobs: its first claim leases ``first_batch``."""
    h = Harness(clock=clock)
    watch = LongJobWatch(after=after)
    h.runner.watch = watch
    h.runner.tuning.batch = BatchSize(100, target=10.0)
    h.runner.tuning.batch.observe(0.001)
    h.runner.tuning.batch._last = first_batch // 2  # the next claim doubles it
    return h, watch


def test_a_job_held_behind_a_long_one_is_given_back_and_another_process_woken():
    clock = FakeClock()
    h, watch = watched_harness(clock)
    long, behind = h.leases.add("unit.long"), h.leases.add("unit.short")
    seen: dict[str, object] = {}

    def the_long_job_runs_on() -> None:
        clock.now += GIVE_BACK_AFTER / 2
        seen["early look"] = watch.look()  # not long yet: look again when it would be
        seen["held early"] = h.leases.status(behind)
        clock.now += GIVE_BACK_AFTER
        seen["look"] = watch.look()
        seen["behind"] = (h.leases.status(behind), h.leases.rows[behind].attempts)
        seen["kept alive"] = h.keeper.held  # the long job's lease alone
        seen["woken"] = list(h.fanned_out)

    WHILE_LONG.append(the_long_job_runs_on)
    assert h.drain() == 2
    assert seen == {"early look": pytest.approx(GIVE_BACK_AFTER / 2), "held early": Status.LEASED,
                    "look": None, "behind": (Status.QUEUED, 0), "kept alive": 1,
                    "woken": [True]}
    # Nobody else took it here (the in-memory store has one process): this drain did, later.
    assert ran_jobs == [long, behind]
    assert h.leases.calls[:2] == ["finish_and_claim(0, claim=2)", "release(1)"]
    assert [h.leases.status(j) for j in (long, behind)] == [Status.COMPLETED] * 2
    assert h.leases.rows[behind].attempts == 1  # the give-back did not count an attempt
    assert (h.stats.processed, h.stats.failed) == (2, 0)


def test_a_batch_of_short_jobs_gives_back_nothing_and_arms_the_watch_once_per_batch():
    # The watch's real thread; on a clock that stands still, so no job ever runs long, however
    # slowly a busy machine runs this test.
    h, watch = watched_harness(FakeClock(), after=0.5)
    armed: list[int] = []
    original = watch.watch

    def counting(held: HeldJobs, give_back: Any) -> None:
        armed.append(len(held))
        original(held, give_back)

    watch.watch = counting  # type: ignore[method-assign]
    jobs = [h.leases.add("unit.short") for _ in range(30)]
    assert h.drain() == 30
    assert not [call for call in h.leases.calls if call.startswith("release")]
    claims = [c for c in h.leases.calls if c.startswith("finish_and_claim") and "claim=0" not in c]
    assert armed == [2, 4, 8, 16] and len(claims) == 5  # the last claim found nothing
    assert Counter(ran_jobs) == Counter(jobs)


def test_between_two_jobs_and_once_nothing_is_held_the_watch_gives_nothing_back():
    clock = FakeClock()
    held = HeldJobs(clock=clock)
    given: list[list[LeasedJob]] = []

    def give_back(jobs: list[LeasedJob]) -> set[UUID]:
        given.append(jobs)
        return {job.id for job in jobs}

    h = Harness()
    held.add([h.lease("unit.short"), h.lease("unit.short")])
    clock.now += 10
    assert held.give_back_if_long(0.2, give_back) == 0.2  # no job runs: the next starts at once
    assert held.start_next() is not None
    held.running_since = clock.now
    clock.now += 0.05
    assert held.give_back_if_long(0.2, give_back) == pytest.approx(0.15)
    clock.now += 0.15
    assert held.give_back_if_long(0.2, give_back) is None and len(given[0]) == 1
    assert held.start_next() is None and held.give_back_if_long(0.2, give_back) is None


def test_what_is_not_given_back_stays_held_and_the_drain_ends_it():
    clock = FakeClock()
    h, watch = watched_harness(clock, first_batch=4)
    long = h.leases.add("unit.long")
    released, cancelled, lost = (h.leases.add("unit.short") for _ in range(3))

    def meanwhile() -> None:
        h.leases.rows[cancelled].status = Status.CANCEL_REQUESTED
        h.keeper.tick()  # the heartbeat tells the process
        h.leases.steal(lost)
        clock.now += GIVE_BACK_AFTER
        assert watch.look() is None

    WHILE_LONG.append(meanwhile)
    h.drain()
    assert "release(3)" in h.leases.calls
    assert h.leases.rows[released].attempts == 1 and h.leases.status(released) == Status.COMPLETED
    assert h.leases.status(cancelled) == Status.CANCELLED  # acknowledged, never run
    assert h.leases.status(lost) == Status.LEASED  # the newer attempt's: nothing written
    # The lost one ran (this kind has no checkpoint to stop at); its finish was fenced.
    assert Counter(ran_jobs) == Counter([long, released, lost])


def test_a_give_back_the_database_refuses_leaves_the_jobs_to_run_here_in_turn(caplog):
    clock = FakeClock()
    h, watch = watched_harness(clock)
    long, behind = h.leases.add("unit.long"), h.leases.add("unit.short")

    def database_gone() -> None:
        clock.now += GIVE_BACK_AFTER
        h.leases.broken = True
        try:
            assert watch.look() is None  # not again for this batch
        finally:
            h.leases.broken = False

    WHILE_LONG.append(database_gone)
    with caplog.at_level(logging.INFO, logger="spacejobs.runner"):
        assert h.drain() == 2
    assert ran_jobs == [long, behind] and h.leases.rows[behind].attempts == 1
    assert h.fanned_out == []
    assert "held jobs not given back (builtins.ConnectionError); they run here in turn" in caplog.text
    assert "database gone" not in caplog.text  # what failed, never its message


class ThreadlessWatch(LongJobWatch):
    """The watch with its looks made by the test alone: the thread would look at the same
    batches meanwhile (and disarm the newer one before the test could see it armed)."""

    def _loop(self) -> None:
        return


def test_a_watch_armed_for_a_new_batch_during_a_look_stays_armed():
    watch = ThreadlessWatch()
    newer = HeldJobs()

    class EndsWhileLooking(HeldJobs):
        def give_back_if_long(self, after: float, give_back: Any) -> float | None:
            watch.watch(newer, give_back)  # the drain claims its next batch meanwhile
            return None  # this one is empty

    watch.watch(EndsWhileLooking(), lambda jobs: set())
    assert watch.look() is None
    assert watch._watched is not None and watch._watched.held is newer
    assert watch._armed.is_set()


def test_a_job_whose_give_back_is_on_its_way_is_never_started_by_the_drain():
    """The long job ends while the give-back's statement runs: the drain waits for it, then
    finds the job gone (and, in this one-process store, claims it again and runs it once). If
    it started the job meanwhile, the job would run here twice: once under a lease given back
    (its finish stale), once under the new one."""
    clock = FakeClock()
    h, watch = watched_harness(clock)
    long, behind = h.leases.add("unit.long"), h.leases.add("unit.short")
    releasing = threading.Event()
    original_release = h.leases.release

    def slow_release(jobs: Any) -> set[UUID]:
        given = original_release(jobs)  # committed: the lease is no longer this process's
        releasing.set()
        time.sleep(0.1)  # the answer's way back: the drain reaches for the next job meanwhile
        return given

    h.leases.release = slow_release  # type: ignore[method-assign]

    def give_back_as_the_long_job_ends() -> None:
        clock.now += GIVE_BACK_AFTER
        threading.Thread(target=watch.look, daemon=True).start()
        assert releasing.wait(5)

    WHILE_LONG.append(give_back_as_the_long_job_ends)
    assert h.drain() == 2
    assert ran_jobs == [long, behind]
    assert h.leases.status(behind) == Status.COMPLETED and h.leases.rows[behind].attempts == 1
    assert (h.stats.processed, h.stats.failed) == (2, 0)  # no stale finish, no lease lost


def test_however_the_watch_and_the_drain_interleave_each_job_runs_once():
    """The watch's own thread, giving back whatever waits as soon as any job runs: many
    give-backs race the drain's next start; every job still runs once, to completion."""
    h, _watch = watched_harness(after=0.0)
    jobs = [h.leases.add("unit.a_millisecond") for _ in range(150)]
    original_release = h.leases.release

    def answered_a_moment_later(jobs: Any) -> set[UUID]:
        given = original_release(jobs)
        time.sleep(0.001)  # the statement's answer on its way back
        return given

    h.leases.release = answered_a_moment_later  # type: ignore[method-assign]
    assert h.drain() == 150  # nobody else here: the drain claims what it gave back
    assert sorted(Counter(ran_jobs).values()) == [1] * 150 and set(ran_jobs) == set(jobs)
    assert all(h.leases.status(job) == Status.COMPLETED for job in jobs)
    assert (h.stats.processed, h.stats.failed) == (150, 0)
    assert [call for call in h.leases.calls if call.startswith("release")]  # it did race
