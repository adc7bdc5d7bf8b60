"""PostgreSQL alone keeps jobs moving: with Redis down, a worker's pool processes claim from the
database (tasks/floor.py), and go back to wake-ups when Redis returns.

Redis here is a private redis-server that each test owns (``private_redis``), because it is
killed; nothing is mocked: the workers, beat and the web talk to it as in production.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spacejobs.models.settings import Settings
from spacejobs.tasks.wakeups import WakeupPublisher
from tests.conftest import submit
from tests.kit.private_servers import RestartableRedis
from tests.kit.servers import Servers
from tests.kit.stack import Stack, running_stack
from tests.kit.waiting import wait_until

#: what a pool process logs when it starts claiming from PostgreSQL alone, and when it stops
DEGRADED = "broker unreachable: this process claims from PostgreSQL alone"
RECOVERED = "broker reachable again: back to its wake-ups"
# A short idle poll would hide the floor's broker rule behind its idle rule: turn it off, so
# that only the broker's absence can make these workers drain without a wake-up.
FLOOR = {"SPACEJOBS_FLOOR_INTERVAL": "0.5", "SPACEJOBS_FLOOR_IDLE_POLL": "0"}
LINGER: float = Settings.model_fields["linger_seconds"].default


@pytest.fixture()
def fresh_stack(servers: Servers, tmp_path: Path) -> Iterator[Stack]:
    with running_stack(servers, tmp_path) as built:
        yield built


def test_jobs_submitted_while_redis_is_down_run_and_wake_ups_resume_when_it_returns(
        fresh_stack: Stack, private_redis: RestartableRedis) -> None:
    stack = fresh_stack
    worker = stack.start_worker(concurrency=2, REDIS_URL=private_redis.url, **FLOOR)
    client = stack.make_app(BROKER_URL=private_redis.url).test_client()
    org = stack.org()
    anna = stack.user(org, role="owner")
    before = submit(client, org, anna, "bench.noop")
    stack.wait_for(before["id"], "completed", timeout=30)

    private_redis.kill()
    # A hold, not a wait: past the linger of the drain that ran `before`, whose LISTEN would
    # otherwise take these submits without any floor.
    time.sleep(LINGER + 1)
    jobs = [submit(client, org, anna, "bench.sleep", {"seconds": 0.2}) for _ in range(5)]
    for job in jobs:  # the rows are durable: every submit was accepted
        assert job["status"] == "queued"
    for job in jobs:
        done = stack.wait_for(job["id"], "completed", timeout=30)
        assert done["attempts"] == 1
    assert worker.output().count(DEGRADED) >= 1
    assert worker.alive

    private_redis.start()
    wait_until(lambda: worker.has_logged(RECOVERED), 30, "the worker's floor back to wake-ups")
    wait_until(lambda: worker.output().count("Connected to") >= 2, 30, "Celery reconnected")
    after = submit(client, org, anna, "bench.noop")
    # Back to wake-ups (with no idle poll, nothing else would run it). The web may still be in
    # its broker back-off after the outage; a fresh publisher is not.
    assert WakeupPublisher(private_redis.url, stack.queue).wake(after["id"])
    stack.wait_for(after["id"], "completed", timeout=30)
    assert worker.alive


def test_a_worker_started_while_redis_is_down_runs_the_jobs_waiting_for_it(
        fresh_stack: Stack, private_redis: RestartableRedis) -> None:
    stack = fresh_stack
    client = stack.make_app(BROKER_URL=private_redis.url).test_client()
    org = stack.org()
    anna = stack.user(org, role="owner")
    private_redis.kill()
    jobs = [submit(client, org, anna, "bench.noop") for _ in range(3)]
    # Celery never says "ready" without its broker: the floor's line says the pool is up.
    worker = stack.processes.start("w-no-redis", stack.worker_argv("w-no-redis", 2),
                                   stack.env(REDIS_URL=private_redis.url, **FLOOR),
                                   ready=DEGRADED, timeout=60)
    for job in jobs:
        assert stack.wait_for(job["id"], "completed", timeout=30)["attempts"] == 1
    # It keeps running (no crash loop) and takes new work by itself too.
    later = submit(client, org, anna, "bench.noop")
    stack.wait_for(later["id"], "completed", timeout=30)
    assert worker.alive and "Unrecoverable error" not in worker.output()


def test_with_redis_up_a_worker_that_hears_no_wake_up_still_claims(fresh_stack: Stack) -> None:
    """A consumer that is alive but hears nothing (a lost message, a wedged reconnect): the
    idle poll claims what is due. The worker reads another queue than the one the web wakes,
    so no wake-up ever reaches it."""
    stack = fresh_stack
    worker = stack.processes.start(
        "w-deaf", stack.worker_argv("w-deaf", 1, queue=f"{stack.queue}-nobody-wakes"),
        stack.env(SPACEJOBS_FLOOR_INTERVAL="0.5", SPACEJOBS_FLOOR_IDLE_POLL="1"),
        ready="ready.", timeout=60)
    client = stack.make_app().test_client()
    org = stack.org()
    anna = stack.user(org, role="owner")
    job = submit(client, org, anna, "bench.noop")
    assert stack.wait_for(job["id"], "completed", timeout=30)["attempts"] == 1
    assert not worker.has_logged(DEGRADED)


def test_a_job_the_floor_runs_is_given_back_at_a_warm_shutdown(
        fresh_stack: Stack, private_redis: RestartableRedis) -> None:
    """A pool process whose drain the floor started (Redis down from the start: no wake-up ever
    ran there) still gives its job back after the grace on SIGTERM."""
    import signal

    stack = fresh_stack
    client = stack.make_app(BROKER_URL=private_redis.url).test_client()
    org = stack.org()
    anna = stack.user(org, role="owner")
    private_redis.kill()
    leaving = stack.processes.start(
        "w-leaving", stack.worker_argv("w-leaving", 1),
        stack.env(REDIS_URL=private_redis.url, SPACEJOBS_SHUTDOWN_GRACE="0.5", **FLOOR),
        ready=DEGRADED, timeout=60)
    job = submit(client, org, anna, "bench.sleep", {"seconds": 8})
    stack.wait_for(job["id"], "leased", timeout=30)
    leaving.popen.send_signal(signal.SIGTERM)
    assert leaving.popen.wait(timeout=30) == 0
    row = stack.job_row(job["id"])
    assert (row["status"], row["attempts"]) == ("queued", 0)  # given back, attempt not counted
    assert [e["to_status"] for e in stack.events(job["id"])] == ["queued", "leased", "queued"]
