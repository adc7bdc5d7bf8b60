"""One worker process's wiring (tasks/worker_process.py), built from settings without a server:
the controls cache and its bound, the one per-process handle and what a fork does to it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spacejobs.models.settings import Settings
from spacejobs.tasks import worker_process


class FakeLeases:
    def __init__(self) -> None:
        self.reads = 0

    def claim_controls(self) -> list[tuple[str, bool, int | None]]:
        self.reads += 1
        return [("bench.noop", self.reads > 1, None)]


@pytest.fixture(autouse=True)
def nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    # Engines connect lazily: a URL that leads nowhere is enough to build the wiring.
    monkeypatch.setattr(worker_process, "role_url",
                        lambda role: "postgresql+psycopg://nobody@127.0.0.1:9/nowhere")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [50.0]
    monkeypatch.setattr(worker_process, "time", SimpleNamespace(monotonic=lambda: now[0]))
    return now


def process_with(ttl: float) -> tuple[worker_process.WorkerProcess, FakeLeases]:
    process = worker_process.WorkerProcess(Settings(controls_ttl=ttl))
    leases = FakeLeases()
    process.leases = leases  # type: ignore[assignment]
    return process, leases


def test_controls_are_read_again_only_after_their_ttl(clock):
    process, leases = process_with(1.0)
    assert process.controls() == [("bench.noop", False, None)]
    clock[0] += 1.0
    assert process.controls() == [("bench.noop", False, None)] and leases.reads == 1
    clock[0] += 0.01
    assert process.controls() == [("bench.noop", True, None)] and leases.reads == 2


def test_a_ttl_of_zero_reads_the_controls_at_every_claim(clock):
    process, leases = process_with(0.0)
    clock[0] += 0.001
    process.controls()
    clock[0] += 0.001
    process.controls()
    assert leases.reads == 2


def test_without_a_url_to_listen_on_a_process_does_not_linger(monkeypatch):
    monkeypatch.setattr(worker_process, "listen_url", lambda url: None)
    process, _ = process_with(1.0)
    assert process.wait_for_work(5) is False


def test_the_handle_is_one_per_process_and_a_fork_drops_it(monkeypatch):
    monkeypatch.setattr(worker_process, "_current", None)
    first = worker_process.current()
    assert worker_process.current() is first
    disposed = []
    monkeypatch.setattr(first.engine, "dispose", lambda close=True: disposed.append(close))
    worker_process._forget_parent()  # what os.register_at_fork runs in the child
    assert disposed == [False]  # the parent's sockets are dropped, never closed from the child
    assert worker_process.current() is not first


def test_a_stopping_process_says_so_to_its_linger(monkeypatch, clock):
    process, _ = process_with(1.0)
    process.shutdown.request_stop()
    assert process.shutdown.stop_requested()
