"""Celery remote control is off unless an operator opts in (SPACEJOBS_REMOTE_CONTROL): anyone who
can publish to Redis could otherwise stop every worker with `celery control shutdown`.

The broadcasts go to a private Redis (``private_redis``): on the session's Redis a shutdown would
reach every other test's workers too.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from celery import Celery

from spacejobs.tasks.wakeups import WakeupPublisher
from tests.conftest import submit
from tests.kit.private_servers import RestartableRedis
from tests.kit.processes import REPO_ROOT
from tests.kit.stack import Stack
from tests.kit.waiting import wait_until


def _celery(stack: Stack, redis: RestartableRedis, *args: str) -> subprocess.CompletedProcess[str]:
    """The `celery` command line, as an operator (or an attacker with the broker URL) runs it."""
    return subprocess.run([sys.executable, "-m", "celery", "-A", "spacejobs.tasks.celery_app", *args],
                          env=stack.env(REDIS_URL=redis.url), cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60, check=False)


class _EventListener(threading.Thread):
    """Task and worker events, which Flower and `celery events` read, as they arrive."""

    def __init__(self, broker_url: str) -> None:
        super().__init__(daemon=True)
        self.app = Celery("listener", broker=broker_url, set_as_current=False)
        self.types: list[str] = []
        self.receiver = None
        self.listening = threading.Event()

    def run(self) -> None:
        with self.app.connection_for_read() as conn:
            self.receiver = self.app.events.Receiver(
                conn, handlers={"*": lambda event: self.types.append(event["type"])})
            # Called once its queue is bound: from then on no event is missed.
            self.receiver.on_consume_ready = lambda *args, **kwargs: self.listening.set()
            self.receiver.capture(limit=None, timeout=None, wakeup=False)  # until should_stop

    def stop(self) -> None:
        if self.receiver is not None:
            self.receiver.should_stop = True
        self.join(timeout=5)


def test_by_default_a_broadcast_shutdown_does_not_stop_the_worker_and_events_still_flow(
        bare_stack: Stack, private_redis: RestartableRedis) -> None:
    stack = bare_stack
    events = _EventListener(private_redis.url)
    events.start()
    assert events.listening.wait(10)
    worker = stack.start_worker(concurrency=1, REDIS_URL=private_redis.url)
    try:
        inspected = _celery(stack, private_redis, "inspect", "ping")
        assert inspected.returncode != 0 and "No nodes replied" in inspected.stderr + inspected.stdout
        sent = _celery(stack, private_redis, "control", "shutdown")
        assert "No nodes replied" in sent.stderr + sent.stdout
        time.sleep(2)
        assert worker.popen.poll() is None, worker.output()[-3000:]
        assert "shutdown" not in worker.output().lower()

        client = stack.make_app(BROKER_URL=private_redis.url).test_client()
        org = stack.org()
        anna = stack.user(org, role="owner")
        job = submit(client, org, anna, "bench.noop")
        assert WakeupPublisher(private_redis.url, stack.queue).wake(job["id"])
        stack.wait_for(job["id"], "completed")
        wait_until(lambda: {"worker-heartbeat", "task-succeeded"} <= set(events.types), 10,
                   lambda: f"a heartbeat and a success among {sorted(set(events.types))}")
    finally:
        events.stop()
        stack.retire(worker)


@pytest.mark.parametrize("command", [("inspect", "ping"), ("control", "shutdown")])
def test_an_operator_who_opts_in_gets_remote_control_back(
        bare_stack: Stack, private_redis: RestartableRedis, command: tuple[str, str]) -> None:
    """The positive control: the same commands reach a worker that opted in."""
    stack = bare_stack
    worker = stack.start_worker(concurrency=1, REDIS_URL=private_redis.url,
                                SPACEJOBS_REMOTE_CONTROL="1")
    try:
        answer = _celery(stack, private_redis, *command)
        if command == ("inspect", "ping"):
            assert answer.returncode == 0 and "pong" in answer.stdout, answer.stderr
        else:  # a worker that shuts down sends no reply: it exits
            assert worker.popen.wait(timeout=30) == 0
            assert "shutdown" in worker.output().lower()
    finally:
        stack.retire(worker)
