"""The worker's health port as anyone on the network would attack it (docs/security.md): 300
connections that send nothing, against a real Celery worker started with the probe on.

Unfixed, each connection held a thread of the worker's main process forever (3 -> 303 threads),
on every interface. The probe must keep the main process's thread count small whatever a client
does, still answer a real ``GET /healthz`` while those connections are open, drop them after its
read timeout, and listen on loopback only unless told otherwise.
"""

from __future__ import annotations

import selectors
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import psutil
import pytest

from tests.kit.processes import LoggedProcess, free_port
from tests.kit.servers import Servers
from tests.kit.stack import running_stack
from tests.kit.waiting import wait_until

IDLE_CONNECTIONS = 300
#: the worker's main process before the attack had 3 or 4 threads (Celery's, and the probe's)
THREAD_BOUND = 10
#: the probe's read timeout (tasks/health.py, 5 s) and some patience for a loaded machine
CLOSED_WITHIN = 15.0
FAST = {"SPACEJOBS_PRESENCE_INTERVAL": "0.5"}
#: the worker and its probe's port
Probed = tuple[LoggedProcess, int]


@pytest.fixture(scope="module")
def probed(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Probed]:
    """A worker of a database of its own with the probe on a free port, once it answers 200."""
    with running_stack(servers, tmp_path_factory.mktemp("probe")) as stack:
        port = free_port()
        worker = stack.start_worker(concurrency=1, SPACEJOBS_WORKER_HEALTH_PORT=str(port), **FAST)
        wait_until(lambda: healthz(port)[0] == 200, 30, lambda: f"the probe answering 200 ({healthz(port)})")
        yield worker, port


def healthz(port: int, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()
    except OSError as error:
        return 0, repr(error)


def closed_by_the_server(connections: list[socket.socket], within: float) -> int:
    """How many of ``connections`` the server closes (EOF or reset) within ``within`` s."""
    closed = 0
    with selectors.DefaultSelector() as waiting:
        for connection in connections:
            waiting.register(connection, selectors.EVENT_READ)
        deadline = time.monotonic() + within
        while waiting.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in waiting.select(left):
                waiting.unregister(key.fileobj)
                try:
                    closed += key.fileobj.recv(1) == b""  # type: ignore[union-attr]
                except ConnectionResetError:
                    closed += 1
    return closed


def test_idle_connections_cost_no_thread_and_the_probe_still_answers(probed: Probed) -> None:
    worker, port = probed
    main = psutil.Process(worker.pid)
    before = main.num_threads()
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(IDLE_CONNECTIONS)]
    try:
        time.sleep(1)  # the server has accepted them all by now
        threads = main.num_threads()
        started = time.monotonic()
        status, said = healthz(port, timeout=10)
        took = time.monotonic() - started
        closed = closed_by_the_server(idle, CLOSED_WITHIN)
    finally:
        for connection in idle:
            connection.close()
    problems = []
    if threads >= THREAD_BOUND:
        problems.append(f"(a) the worker's main process went from {before} to {threads} threads")
    if status != 200 or took > 3:
        problems.append(f"(b) GET /healthz answered {status} {said.strip()!r} after {took:.2f} s")
    if closed != IDLE_CONNECTIONS:
        problems.append(f"(c) {closed} of {IDLE_CONNECTIONS} idle connections closed by the server "
                        f"within {CLOSED_WITHIN:.0f} s")
    assert not problems, "\n".join(problems)
    # And the worker is none the worse for it.
    assert main.num_threads() < THREAD_BOUND
    assert healthz(port)[0] == 200


def test_the_probe_listens_on_loopback_only_unless_told_otherwise(probed: Probed) -> None:
    worker, port = probed
    listening = {(c.laddr.ip, c.laddr.port) for c in psutil.Process(worker.pid).net_connections("inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
    assert listening == {("127.0.0.1", port)}

