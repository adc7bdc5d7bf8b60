"""A Redis restart under a worker that holds a reserved wake-up: the worker must reconnect, not die.

The crash (docs/concepts/leases-and-fencing.md): kombu's ``Connection.collect()`` stops closing
channels at the first one that fails, detaches the transport anyway, and Celery 5.7 then closes
the task channel again; restoring its unacknowledged wake-ups needs the detached transport and
raises ``AttributeError: 'NoneType' object has no attribute 'hostname'``, which kills the
worker's main process. It takes three things at once: a wake-up reserved (both pool processes
busy), a BRPOP in flight, and a second channel on the connection (remote control's mailbox, or
gossip) whose close fails first. In the chaos runs that order was luck; here it is arranged: the
worker's main process is frozen, the subscriber connection is dropped first, then Redis dies.

Redis is a private redis-server that this test owns (``private_redis``), because it kills it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spacejobs.tasks.wakeups import WakeupPublisher
from tests.conftest import submit
from tests.kit.private_servers import RestartableRedis
from tests.kit.processes import LoggedProcess
from tests.kit.servers import Servers
from tests.kit.stack import Stack, running_stack
from tests.kit.waiting import wait_until

OUTAGE = 2.0


@pytest.fixture()
def fresh_stack(servers: Servers, tmp_path: Path) -> Iterator[Stack]:
    """A database and queue of this test alone: no earlier job may keep a process busy."""
    with running_stack(servers, tmp_path) as built:
        yield built


def _wait_for_count(proc: LoggedProcess, needle: str, count: int, timeout: float) -> None:
    def seen() -> bool:
        assert "Unrecoverable error" not in proc.output(), proc.output()[-6000:]
        assert proc.popen.poll() is None, proc.output()[-6000:]
        return proc.output().count(needle) >= count

    wait_until(seen, timeout, lambda: f"{count} x {needle!r} seen:\n{proc.output()[-4000:]}",
               interval=0.05)


def _freeze_with_brpop_pending(worker: LoggedProcess, server: RestartableRedis, timeout: float = 10) -> None:
    """SIGSTOP the worker's main process (its pool runs on) at a moment its BRPOP is in flight:
    Redis shows that connection blocked while the process cannot read the reply."""
    def frozen_while_blocked() -> bool:
        os.kill(worker.pid, signal.SIGSTOP)
        if any("b" in c["flags"] and c["cmd"] == "brpop" for c in server.client().client_list()):
            return True
        os.kill(worker.pid, signal.SIGCONT)
        return False

    wait_until(frozen_while_blocked, timeout, "the worker frozen with a BRPOP in flight",
               interval=0.02)


@pytest.mark.parametrize("remote_control", ["0", "1"], ids=["default", "remote-control-opted-in"])
def test_worker_reconnects_after_a_redis_restart_while_a_wakeup_waits(
        fresh_stack: Stack, private_redis: RestartableRedis, remote_control: str) -> None:
    stack = fresh_stack
    worker = stack.start_worker(concurrency=2, REDIS_URL=private_redis.url,
                                SPACEJOBS_REMOTE_CONTROL=remote_control)
    client = stack.make_app(BROKER_URL=private_redis.url).test_client()
    org = stack.org()
    anna = stack.user(org, role="owner")
    busy = [submit(client, org, anna, "test.stall", {"seconds": 6}) for _ in range(2)]
    for job in busy:
        stack.wait_for(job["id"], "leased")
    # Both processes are busy: this wake-up is reserved, unacknowledged, and the consumer sends
    # another BRPOP (prefetch 2, one message held). Forced: a submit's wake-up guard may still
    # stand, and then a plain wake() would count on a message that is already running a job.
    received = worker.output().count("] received")
    assert WakeupPublisher(private_redis.url, stack.queue).wake(force=True)
    _wait_for_count(worker, "] received", received + 1, timeout=10)

    _freeze_with_brpop_pending(worker, private_redis)
    try:
        # The subscriber connection first (remote control's mailbox, when there is one), so
        # the worker notices the loss there with the BRPOP still pending; then all of Redis.
        mailboxes = private_redis.client().client_kill_filter(_type="pubsub")
        wait_until(lambda: not any(int(c["sub"]) or int(c["psub"])
                                    for c in private_redis.client().client_list()))
        private_redis.kill()
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    _wait_for_count(worker, "Connection to broker lost", 1, timeout=10)
    time.sleep(OUTAGE)
    private_redis.start()

    _wait_for_count(worker, "Connected to", 2, timeout=30)
    after = submit(client, org, anna, "bench.noop")
    # The web may still be in its broker back-off after the restart; a fresh publisher is not.
    assert WakeupPublisher(private_redis.url, stack.queue).wake(after["id"])
    stack.wait_for(after["id"], "completed", timeout=30)
    for job in busy:
        stack.wait_for(job["id"], "completed", timeout=30)
    assert worker.popen.poll() is None
    assert "Unrecoverable error" not in worker.output()
    # Opted in, the worker listened to the remote-control mailbox; by default it does not.
    assert mailboxes == int(remote_control)
