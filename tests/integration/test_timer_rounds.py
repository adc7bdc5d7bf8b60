"""Beat's rounds of due timers (tasks/timer_rounds.py), with real worker and beat processes:
a sleeping job goes back to the queue between the full sweeps, and the rounds carry on through
a database partition and a dead broker. Every beat here sweeps once an hour at most, so what
resumes a timer within a test's patience is the rounds, nothing else."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from spacejobs.models.db.roles import WORKER_ROLE, role_url
from tests.conftest import submit
from tests.kit.private_servers import RestartableRedis
from tests.kit.stack import Stack, wait_until
from tests.netproxy import Partition, postgres_address, through

#: the full sweep never runs during these tests (its first run is one interval after beat starts)
NO_SWEEP = {"SPACEJOBS_SWEEP_INTERVAL": "3600", "SPACEJOBS_TIMER_INTERVAL": "0.2"}


def resumed(stack: Stack, job_id: str) -> bool:
    """A round of beat's put the job back in the queue."""
    return ("waiting", "queued", "beat") in [(e["from_status"], e["to_status"], e["actor"])
                                             for e in stack.events(job_id)]


def past_its_moment(stack: Stack, job_id: str) -> bool:
    with stack.admin() as conn:
        return bool(conn.execute(text("SELECT wait_until < now() FROM jobs WHERE id = :id"),
                                 {"id": job_id}).scalar_one())


@pytest.fixture
def client(bare_stack: Stack):
    return bare_stack.make_app().test_client()


def test_beat_resumes_timers_between_sweeps(bare_stack: Stack, client):
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
            # A round of beat's resumed it (a sweep's resume is the sweeper's).
            assert [e["actor"] for e in stack.events(job["id"])
                    if e["from_status"] == "waiting"] == ["beat"]
        assert "sweep ran" not in beat.output()
        beat.check_alive()
    finally:
        stack.retire(worker, beat)


def test_the_rounds_ride_out_a_database_partition_of_beat(bare_stack: Stack, client):
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
        # Its moment passes while no round can reach the database; beat logs it and goes on.
        beat.wait_for_log("a round of due timers failed", timeout=20)
        wait_until(lambda: past_its_moment(stack, job["id"]), timeout=20, what="the moment passed")
        assert stack.job_row(job["id"])["status"] == "waiting"
        beat.check_alive()
        partition.open_again()
        done = stack.wait_for(job["id"], "completed", timeout=30)
        assert done["attempts"] == 1 and resumed(stack, job["id"])
        beat.wait_for_log("rounds of due timers work again", timeout=10)
        # Once, with its traceback, not once per round of the partition.
        assert beat.output().count("a round of due timers failed") == 1
    finally:
        partition.cut()
        stack.retire(worker, beat)


def test_the_rounds_go_on_resuming_timers_with_beats_broker_dead(bare_stack: Stack, client,
                                                                   private_redis: RestartableRedis):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    worker = stack.start_worker(concurrency=2)
    # Beat's wake-ups go to a Redis of its own, killed once beat runs: the rounds still move the
    # rows, whose wake-ups the sweep re-sends when the broker is back.
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
