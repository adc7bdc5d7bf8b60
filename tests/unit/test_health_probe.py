"""The worker's liveness probe (tasks/health.py) on its own: what it answers, and that no client
holds it: silent and trickling connections are dropped after the read timeout, the one waiting
longest makes room for a new one, and it is one thread whatever the clients do. The attack on a
real worker: tests/integration/test_health_probe_attack.py."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import sqlalchemy
from pydantic import ValidationError

from spacejobs.models.settings import Settings
from spacejobs.tasks import health
from tests.kit.processes import free_port

READ_TIMEOUT = 0.5


@pytest.fixture
def probe() -> Iterator[health.Probe]:
    started = health.Probe(lambda: (200, "ok: fine"), "127.0.0.1", 0, read_timeout=READ_TIMEOUT,
                           max_waiting=4).start()
    yield started
    started.close()


def get(probe: health.Probe, path: str = "/healthz") -> tuple[int, str]:
    host, port = probe.address
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def connect(probe: health.Probe) -> socket.socket:
    return socket.create_connection(probe.address, timeout=5)


def closed_after(connection: socket.socket) -> float:
    """Seconds until the server closes ``connection`` (EOF or reset)."""
    started = time.monotonic()
    with contextlib.suppress(ConnectionResetError):
        assert connection.recv(100) == b""
    return time.monotonic() - started


def test_it_answers_the_check_on_healthz_only(probe: health.Probe) -> None:
    assert get(probe) == (200, "ok: fine\n")
    assert get(probe, "/healthz?x=1") == (404, "not found\n")
    assert get(probe, "/") == (404, "not found\n")
    with connect(probe) as raw:
        raw.sendall(b"POST /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert raw.recv(100).startswith(b"HTTP/1.0 405 ")
    with connect(probe) as raw:
        raw.sendall(b"nonsense\n\n")
        assert raw.recv(100).startswith(b"HTTP/1.0 400 ")


def test_a_failing_check_is_a_503() -> None:
    failing = health.Probe(lambda: (503, "FAIL: frozen"), "127.0.0.1", 0).start()
    try:
        assert get(failing) == (503, "FAIL: frozen\n")
    finally:
        failing.close()


def test_a_silent_connection_is_dropped_after_the_read_timeout(probe: health.Probe) -> None:
    with connect(probe) as silent:
        assert READ_TIMEOUT * 0.8 < closed_after(silent) < READ_TIMEOUT + 1


def test_a_trickling_connection_is_dropped_after_the_read_timeout_too(probe: health.Probe) -> None:
    """The timeout is for the whole head, not for each read: a byte every 50 ms never resets it."""
    with connect(probe) as trickling:
        started = time.monotonic()
        for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\n" * 10:  # never the blank line
            try:
                trickling.sendall(bytes([byte]))
            except OSError:
                break  # closed by the server
            time.sleep(0.05)
        else:
            pytest.fail("the probe kept reading a trickle for 16 s")
        assert time.monotonic() - started < READ_TIMEOUT + 1


def test_beyond_the_cap_the_longest_waiting_connection_makes_room(probe: health.Probe) -> None:
    idle = [connect(probe) for _ in range(4)]
    try:
        time.sleep(0.1)
        newest = connect(probe)  # the fifth: the first is closed at once
        assert closed_after(idle[0]) < READ_TIMEOUT / 2
        newest.close()
        assert get(probe) == (200, "ok: fine\n")  # and a real probe is answered while they wait
    finally:
        for connection in idle:
            connection.close()


def test_it_is_one_thread_whatever_the_clients_do(probe: health.Probe) -> None:
    before = threading.active_count()
    idle = [connect(probe) for _ in range(50)]
    try:
        assert get(probe) == (200, "ok: fine\n")
        assert threading.active_count() == before
    finally:
        for connection in idle:
            connection.close()


def test_the_probe_listens_on_loopback_unless_the_bind_setting_says_otherwise() -> None:
    assert str(Settings().worker_health_bind) == "127.0.0.1"
    engine = sqlalchemy.create_engine("sqlite://")  # no worker tables: the check cannot read them
    opened = health.serve(engine, Settings(worker_health_port=free_port(), worker_health_bind="0.0.0.0"))
    try:
        assert opened.address[0] == "0.0.0.0"
        assert get(opened)[0] == 503
    finally:
        opened.close()


def test_the_bind_setting_is_an_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPACEJOBS_WORKER_HEALTH_BIND", "everywhere")
    with pytest.raises(ValidationError, match="worker_health_bind"):
        Settings()
