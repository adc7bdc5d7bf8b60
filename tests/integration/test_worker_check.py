"""``spacejobs worker check`` and the worker's HTTP probe, as an orchestrator runs them: the
command on the worker's host (exit 0 or 1 with one line), ``GET /healthz`` (200 or 503), against
real workers: one that works, one frozen (its heartbeats stop), one alive beside due jobs it
never hears of and never claims."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import submit
from tests.kit.processes import REPO_ROOT
from tests.kit.servers import Servers
from tests.kit.stack import Stack, running_stack
from tests.kit.waiting import wait_until

FAST = {"SPACEJOBS_PRESENCE_INTERVAL": "0.5"}


@pytest.fixture()
def fresh_stack(servers: Servers, tmp_path: Path) -> Iterator[Stack]:
    """A database of its own: the check reads every process of this host in it."""
    with running_stack(servers, tmp_path) as built:
        yield built


def check(stack: Stack, *args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "spacejobs.webapp.cli", "worker", "check", *args],
                          cwd=REPO_ROOT, env=stack.env(**FAST), capture_output=True, text=True,
                          timeout=60, check=False)
    return done.returncode, (done.stdout + done.stderr).strip()


def test_no_worker_fails_and_a_working_one_passes(fresh_stack: Stack) -> None:
    stack = fresh_stack
    code, said = check(stack)
    assert (code, said) == (1, f"FAIL: no live worker process of {socket.gethostname()} has registered")
    stack.start_worker(concurrency=2, **FAST)
    wait_until(lambda: check(stack)[0] == 0, 30, lambda: f"the check passing ({check(stack)})")
    assert check(stack)[1].startswith("ok: 2 worker process(es) on this host, heartbeats ")


def test_a_frozen_worker_fails_once_its_heartbeats_stop(fresh_stack: Stack) -> None:
    stack = fresh_stack
    port = free_port()
    worker = stack.start_worker(concurrency=1, SPACEJOBS_WORKER_HEALTH_PORT=str(port), **FAST)
    wait_until(lambda: check(stack)[0] == 0, 30, "the check passing")
    # The pool process alone: the main process (and its probe) keeps answering.
    pool = psutil.Process(worker.pid).children()
    for child in pool:
        child.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: check(stack, "--stale", "2")[0] == 1, 30, "the check failing")
        assert "has not heartbeated for" in check(stack, "--stale", "2")[1]
        # The probe's threshold is 3 presence intervals (1.5 s here).
        with pytest.raises(urllib.error.HTTPError) as failing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=20)
        assert failing.value.code == 503
        assert "has not heartbeated for" in failing.value.read().decode()
    finally:
        for child in pool:
            child.send_signal(signal.SIGCONT)
    wait_until(lambda: check(stack, "--stale", "2")[0] == 0, 30, "the check passing again")


def free_port() -> int:
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        return int(probe_socket.getsockname()[1])


def test_a_worker_idle_beside_due_jobs_fails(fresh_stack: Stack) -> None:
    """Its consumer hears no wake-up (another queue) and its floor's idle poll is off: alive,
    heartbeating, and not claiming. The probe says so too."""
    stack = fresh_stack
    port = free_port()
    stack.processes.start("w-deaf", stack.worker_argv("w-deaf", 1, queue=f"{stack.queue}-deaf"),
                          stack.env(SPACEJOBS_FLOOR_IDLE_POLL="0", SPACEJOBS_WORKER_HEALTH_PORT=str(port),
                                    **FAST), ready="ready.", timeout=60)
    wait_until(lambda: check(stack)[0] == 0, 30, "the check passing while nothing is due")
    org = stack.org()
    anna = stack.user(org, role="owner")
    submit(stack.make_app().test_client(), org, anna, "bench.noop")
    wait_until(lambda: check(stack, "--due-after", "1")[0] == 1, 30, "the check failing")
    assert "jobs have been due for" in check(stack, "--due-after", "1")[1]
    # The probe's threshold is a minute: the job has not been due that long, and it answers 200.
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=20) as answer:
        assert answer.status == 200 and answer.read().decode().startswith("ok: 1 worker process(es)")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/anything-else", timeout=20)
    assert refused.value.code == 404
