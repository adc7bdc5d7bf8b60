"""Beat's timers chore (tasks/maintenance/timers.py): a run against PostgreSQL puts back exactly
the timers that are due; and with real worker and beat processes a sleeping job goes back to
the queue on the timers' own cadence, and the runs carry on through a database partition and
a dead broker. Every beat here runs the sweep's chores (the waits chore among them) at its
start and then once an hour, so what resumes a timer within a test's patience is the timers
chore, nothing else."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from spacejobs.models.db.roles import WORKER_ROLE, role_url
from spacejobs.tasks.maintenance.timers import Timers, TimersReport
from tests.conftest import submit
from tests.integration.maintenance_kit import Publisher, as_beat, status_of, waiting
from tests.kit.private_servers import RestartableRedis
from tests.kit.stack import Stack, wait_until
from tests.netproxy import Partition, postgres_address, through

#: the sweep's chores run at beat's start, before any job here waits, and not again in a test
NO_SWEEP = {"SPACEJOBS_SWEEP_INTERVAL": "3600", "SPACEJOBS_TIMER_INTERVAL": "0.2"}


def resumed(stack: Stack, job_id: str) -> bool:
    """The timers chore put the job back in the queue."""
    return ("waiting", "queued", "beat") in [(e["from_status"], e["to_status"], e["actor"])
                                             for e in stack.events(job_id)]


def past_its_moment(stack: Stack, job_id: str) -> bool:
    with stack.admin() as conn:
        return bool(conn.execute(text("SELECT wait_until < now() FROM jobs WHERE id = :id"),
                                 {"id": job_id}).scalar_one())


@pytest.fixture
def client(bare_stack: Stack):
    return bare_stack.make_app().test_client()


def test_a_run_puts_back_exactly_the_timers_that_are_due_as_beats(bare_stack: Stack):
    stack = bare_stack
    now = datetime.now(UTC)
    due = waiting(stack, until=now - timedelta(seconds=1))
    later = waiting(stack, until=now + timedelta(hours=1))
    signal = waiting(stack, signal="approve")
    publisher = Publisher()
    report = Timers(0.25).run(as_beat(stack, publisher))
    assert report == TimersReport(resumed=1, wakeups_sent=1)
    assert publisher.woken == [str(due.id)]
    assert [status_of(stack, j.id) for j in (due, later, signal)] == [
        "queued", "waiting", "waiting"]
    assert resumed(stack, str(due.id))  # recorded as beat's
    assert Timers(0.25).run(as_beat(stack)) == TimersReport()


def test_beat_resumes_timers_on_their_own_cadence(bare_stack: Stack, client):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    worker = stack.start_worker(concurrency=2)
    beat = stack.start_beat(**NO_SWEEP)
    try:
        jobs = [submit(client, org, anna, "bench.wait", {"seconds": 1}) for _ in range(3)]
        for job in jobs:
            done = stack.wait_for(job["id"], "completed", timeout=30)
            assert done["attempts"] == 1 and done["result"] == {"waited": 1}
            moves = [(e["from_status"], e["to_status"]) for e in stack.events(job["id"])]
            assert moves == [(None, "queued"), ("queued", "leased"), ("leased", "waiting"),
                             ("waiting", "queued"), ("queued", "leased"), ("leased", "completed")]
            # The timers chore resumed it (the waits chore's resume is the sweeper's).
            assert [e["actor"] for e in stack.events(job["id"])
                    if e["from_status"] == "waiting"] == ["beat"]
        beat.check_alive()
    finally:
        stack.retire(worker, beat)


def test_the_timers_chore_rides_out_a_database_partition_of_beat(bare_stack: Stack, client):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    partition = Partition(postgres_address(stack.admin_url))
    worker = stack.start_worker(concurrency=2)
    beat = stack.start_beat(**NO_SWEEP, SPACEJOBS_WORKER_DATABASE_URL=through(
        role_url(WORKER_ROLE, stack.admin_url), partition))
    try:
        partition.cut()
        job = submit(client, org, anna, "bench.wait", {"seconds": 1})
        stack.wait_for(job["id"], "waiting")
        # Its moment passes while no run can reach the database; beat logs it and goes on.
        beat.wait_for_log("chore timers failed", timeout=20)
        wait_until(lambda: past_its_moment(stack, job["id"]), timeout=20, what="the moment passed")
        assert stack.job_row(job["id"])["status"] == "waiting"
        beat.check_alive()
        partition.open_again()
        done = stack.wait_for(job["id"], "completed", timeout=30)
        assert done["attempts"] == 1 and resumed(stack, job["id"])
        beat.wait_for_log("chore timers works again", timeout=10)
        # Once, with its traceback, not once per run of the partition.
        assert beat.output().count("chore timers failed") == 1
    finally:
        partition.cut()
        stack.retire(worker, beat)


def test_the_timers_chore_goes_on_resuming_timers_with_beats_broker_dead(bare_stack: Stack, client,
                                                                   private_redis: RestartableRedis):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    worker = stack.start_worker(concurrency=2)
    # Beat's wake-ups go to a Redis of its own, killed once beat runs: the timers chore still
    # moves the rows, whose wake-ups the resignal chore re-sends when the broker is back.
    beat = stack.start_beat(**NO_SWEEP, REDIS_URL=private_redis.url)
    try:
        private_redis.kill()
        first = submit(client, org, anna, "bench.wait", {"seconds": 1})
        wait_until(lambda: resumed(stack, first["id"]), timeout=20, what="the first timer resumed")
        second = submit(client, org, anna, "bench.wait", {"seconds": 1})
        wait_until(lambda: resumed(stack, second["id"]), timeout=20, what="the second timer resumed")
        beat.check_alive()
    finally:
        stack.retire(worker, beat)
