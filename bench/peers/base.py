"""What every peer driver shares: the figure record, the interface, worker processes, the
peer's own database, pacing.

A driver measures a peer the way its authors run it (its own installer, its default worker
settings, its own enqueue API) and reads what the workers did from the peer's own records
(tables or Redis), never from worker logs.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

import psycopg
from psycopg import sql

from bench.harness import paced, poll, spread
from spacejobs.models.db.engine import libpq_url, with_database
from spacejobs.models.db.queries import parse_blocks

ROOT = Path(__file__).resolve().parents[2]


class PeerError(RuntimeError):
    """A peer did not do what its figure claims (a worker died, jobs went missing, a timeout)."""


def statements_beside(module_file: str) -> dict[str, str]:
    """The named ``-- name --`` blocks of the ``.sql`` file beside ``module_file``, as text
    for psycopg (``%(name)s`` parameters)."""
    return parse_blocks(Path(module_file).with_suffix(".sql").read_text())


_SQL = statements_beside(__file__)


@dataclass(frozen=True)
class Figure:
    """One measured figure.

    ``value`` is in ``unit`` (jobs/s, or ms for a latency, where it is the p50 and ``spread``
    holds p50/p95/p99/max). ``detail`` says in one line how it was measured. ``load`` is the
    machine's 1/5/15-minute load average when the measurement ended: the machine is shared,
    so a figure without it means little.
    """

    value: float
    unit: str
    detail: str
    spread: Mapping[str, float] = field(default_factory=dict)
    load: tuple[float, float, float] = field(default_factory=os.getloadavg)
    #: other numbers a target needs beside the value (not printed: ``detail`` says them)
    facts: Mapping[str, float] = field(default_factory=dict)

    def __str__(self) -> str:
        if self.spread:
            head = " / ".join(f"{name} {value:.1f}" for name, value in self.spread.items()) + f" {self.unit}"
        else:
            head = f"{self.value:,.0f} {self.unit}"
        return f"{head} ({self.detail}; load {' / '.join(f'{v:.2f}' for v in self.load)})"


def rate_figure(count: int, seconds: float, detail: str) -> Figure:
    return Figure(count / seconds, "jobs/s", f"{count} jobs in {seconds:.3f} s, {detail}")


def latency_figure(seconds: list[float], detail: str) -> Figure:
    """p50/p95/p99 (bench.harness's percentiles) and max of per-job latencies given in seconds."""
    if len(seconds) < 2:
        raise PeerError(f"{len(seconds)} latency samples: too few for percentiles")
    ms = [1000 * value for value in seconds]
    cuts = spread(ms)
    return Figure(cuts["p50"], "ms", f"{len(ms)} jobs, {detail}", cuts)


class Workers:
    """Worker processes, each in a session of its own so that ``killpg`` also ends the children
    it forks (Celery's prefork pool); output goes to a log file per process."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: Mapping[str, str]) -> None:
        environment = dict(os.environ)
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        environment.update(env)
        with self.log(name).open("wb") as handle:
            self.running[name] = subprocess.Popen(
                [sys.executable, *argv], cwd=ROOT, env=environment, stdin=subprocess.DEVNULL,
                stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)

    def log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def tail(self, name: str, chars: int = 3000) -> str:
        path = self.log(name)
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def check_alive(self) -> None:
        for name, popen in self.running.items():
            if popen.poll() is not None:
                raise PeerError(f"worker {name} exited with {popen.returncode}:\n{self.tail(name)}")

    def stop_all(self) -> None:
        # Figures are read before any stop, so nothing is left to finish: SIGKILL the groups.
        for popen in self.running.values():
            with suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
        for popen in self.running.values():
            with suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=10)
        self.running.clear()


class PeerDatabase:
    """A database of the peer's own on the benchmark's server, created from the admin URL."""

    def __init__(self, admin_url: str, name: str) -> None:
        self.admin_url = libpq_url(admin_url)
        self.name = name
        self.url = with_database(self.admin_url, name)

    def _admin(self, statement: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL(statement).format(database=sql.Identifier(self.name)))

    def create(self) -> None:
        self._admin(_SQL["create_database"])

    def drop(self) -> None:
        self._admin(_SQL["drop_database"])


class Peer(ABC):
    """One system measured next to Space Jobs.

    ``prepare`` once, then any of the figures in any order (each leaves the peer's queue empty
    and its workers stopped), then ``cleanup`` (safe to call after a failed ``prepare``). Every
    figure raises :class:`PeerError` when the peer's own records do not show all ``n`` jobs done
    exactly once.
    """

    #: Short name used in database, queue and key names.
    name: ClassVar[str]
    #: A human name with the version measured, for reports.
    title: ClassVar[str]
    #: One line: the settings the workers and producer run with, for the report's header.
    defaults: ClassVar[str]

    def __init__(self) -> None:
        self.log_dir = Path(tempfile.mkdtemp(prefix=f"bench-peer-{self.name}-"))
        self.workers = Workers(self.log_dir)
        self.run_id = ""

    # -- the interface ---------------------------------------------------------------------

    def prepare(self, admin_url: str, redis_url: str, run_id: str) -> Self:
        """Create the peer's own database / queue names for ``run_id`` and install its schema;
        on failure, undo what was done and raise."""
        self.run_id = re.sub(r"[^a-z0-9_]", "_", run_id.lower())
        try:
            self._prepare(admin_url, redis_url)
        except BaseException:
            self.cleanup()
            raise
        return self

    @abstractmethod
    def _prepare(self, admin_url: str, redis_url: str) -> None: ...

    @abstractmethod
    def enqueue_rate(self, n: int) -> Figure:
        """One producer, one job per call, no worker running: jobs/s."""

    def bulk_enqueue_rate(self, n: int, batch: int = 1000) -> Figure | None:
        """``n`` jobs submitted ``batch`` per call through the peer's bulk API; None without one."""
        return None

    @abstractmethod
    def drain_rate(self, n: int, processes: int = 2) -> Figure:
        """``n`` no-op jobs queued with no worker running, then ``processes`` worker processes on
        the peer's defaults: jobs/s from the first job's start to the last job's finish."""

    @abstractmethod
    def latency(self, rate: float = 50, seconds: float = 20, processes: int = 2) -> Figure:
        """Jobs submitted at ``rate`` per second for ``seconds`` to ``processes`` running
        workers: submit -> finished (committed) per job, p50/p95/p99 in ms."""

    def cleanup(self) -> None:
        """Stop the workers, drop the database / purge the Redis keys, remove the logs."""
        self.workers.stop_all()
        try:
            self._cleanup()
        finally:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    @abstractmethod
    def _cleanup(self) -> None: ...

    # -- helpers for the drivers -----------------------------------------------------------

    def wait_until(self, what: str, done: Callable[[], bool], timeout: float,
                   interval: float = 0.1) -> None:
        """Poll ``done`` until it holds; a dead worker or the timeout raises."""
        if not poll(done, timeout, interval=interval, between=self.workers.check_alive):
            logs = "\n".join(f"--- {name}\n{self.workers.tail(name, 1500)}"
                             for name in self.workers.running)
            raise PeerError(f"{self.title}: {what} not reached after {timeout:.0f} s\n{logs}")

    def start_workers(self, processes: int, argv: list[str], env: Mapping[str, str]) -> None:
        for index in range(processes):
            self.workers.start(f"{self.name}-{index + 1}", argv, env)


def drain_timeout(n: int) -> float:
    """Generous: the slowest peer (Procrastinate) drained 83-270 jobs/s on this loaded machine."""
    return 60 + n / 20


T = TypeVar("T")


class PostgresPeer(Peer):
    """A peer whose queue lives in PostgreSQL, in a database of its own.

    The producer runs on an asyncio loop of the benchmark's (both such peers are async-first);
    the figures are read over psycopg with named statements from the ``.sql`` file beside the
    driver, each with the same meaning for every peer:

    - ``waiting_count``: jobs waiting for a worker;
    - ``finished_count``: jobs finished successfully;
    - ``workers_ready``: worker processes connected (and, where the peer says so, registered);
    - ``outcome``: start records, finish records, distinct jobs finished, anomalies (any other
      status, anything left), first start, last finish;
    - ``latencies``: per job, seconds from the submit to the finish and to the start.

    A driver supplies the statements, the producer calls, the worker command and a line for
    each of the figures' details.
    """

    statements: ClassVar[dict[str, str]]
    #: How one job is submitted, how a batch is, and what the outcome's records are.
    enqueue_api: ClassVar[str]
    bulk_api: ClassVar[str]
    records: ClassVar[str]
    loop_factory: ClassVar[Callable[[], asyncio.AbstractEventLoop] | None] = None

    db: PeerDatabase | None = None
    runner: asyncio.Runner | None = None
    reader: psycopg.Connection | None = None

    # -- what a driver supplies ------------------------------------------------------------

    @abstractmethod
    async def _open(self) -> None:
        """Connect the producer to ``self.db.url`` and install the peer's schema its own way."""

    @abstractmethod
    async def _close(self) -> None: ...

    @abstractmethod
    async def _clear(self) -> None:
        """Remove every job and record, so that the next figure reads only its own."""

    @abstractmethod
    async def _submit_one(self) -> None: ...

    @abstractmethod
    async def _submit_many(self, count: int) -> None: ...

    @abstractmethod
    def _worker_argv(self) -> tuple[list[str], dict[str, str]]:
        """The ``python`` arguments and extra environment of one worker process."""

    # -- the figures -----------------------------------------------------------------------

    def _prepare(self, admin_url: str, redis_url: str) -> None:
        self.db = PeerDatabase(admin_url, f"bench_peer_{self.name}_{self.run_id}")
        self.db.create()
        self.runner = asyncio.Runner(loop_factory=self.loop_factory)
        self.run(self._open())
        self.reader = psycopg.connect(self.db.url, autocommit=True)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coroutine)

    def scalar(self, name: str) -> Any:
        return self.reader.execute(self.statements[name]).fetchone()[0]

    def _enqueue(self, n: int, batch: int) -> float:
        async def submit() -> float:
            started = time.perf_counter()
            if batch == 1:
                for _ in range(n):
                    await self._submit_one()
            else:
                for offset in range(0, n, batch):
                    await self._submit_many(min(batch, n - offset))
            return time.perf_counter() - started

        self.run(self._clear())
        seconds = self.run(submit())
        if (waiting := self.scalar("waiting_count")) != n:
            raise PeerError(f"{self.title}: {waiting} jobs waiting after submitting {n}")
        return seconds

    def _start(self, processes: int) -> None:
        argv, env = self._worker_argv()
        self.start_workers(processes, argv, env)

    def _outcome(self, n: int) -> tuple[Any, Any]:
        """First start and last finish; raises unless each of the ``n`` jobs started once and
        finished once, and nothing else happened."""
        started, finished, jobs, anomalies, first, last = (
            self.reader.execute(self.statements["outcome"]).fetchone())
        if not started == finished == jobs == n or anomalies:
            raise PeerError(f"{self.title}: {started} starts and {finished} finishes recorded for {jobs}"
                            f" of {n} jobs, {anomalies} anomalies")
        return first, last

    def _wait_finished(self, n: int, timeout: float) -> None:
        self.wait_until(f"{n} jobs finished", lambda: self.scalar("finished_count") >= n, timeout, 0.2)
        time.sleep(0.5)  # a job run twice would show up as an extra record

    def enqueue_rate(self, n: int) -> Figure:
        seconds = self._enqueue(n, batch=1)
        self.run(self._clear())
        return rate_figure(n, seconds, f"{self.enqueue_api} one by one, no worker; {n} jobs waiting")

    def bulk_enqueue_rate(self, n: int, batch: int = 1000) -> Figure:
        seconds = self._enqueue(n, batch=batch)
        self.run(self._clear())
        return rate_figure(n, seconds, f"{self.bulk_api} of {batch}, no worker; {n} jobs waiting")

    def drain_rate(self, n: int, processes: int = 2) -> Figure:
        self._enqueue(n, batch=1000)
        self._start(processes)
        try:
            self._wait_finished(n, drain_timeout(n))
            first, last = self._outcome(n)
        finally:
            self.workers.stop_all()
        self.run(self._clear())
        return rate_figure(n, (last - first).total_seconds(),
                           f"{processes} worker processes, first start -> last finish ({self.records});"
                           f" {n} jobs started once and finished once")

    def latency(self, rate: float = 50, seconds: float = 20, processes: int = 2) -> Figure:
        self.run(self._clear())
        count = max(2, round(rate * seconds))
        self._start(processes)
        try:
            self.wait_until(f"{processes} workers ready", lambda: self.scalar("workers_ready") >= processes,
                            timeout=120)
            time.sleep(1)  # past LISTEN and the first, empty fetch (well under a second here)
            elapsed = paced(rate, count, lambda: self.run(self._submit_one()))
            self._wait_finished(count, timeout=60)
            self._outcome(count)
            rows = self.reader.execute(self.statements["latencies"]).fetchall()
        finally:
            self.workers.stop_all()
        self.run(self._clear())
        if len(rows) != count:
            raise PeerError(f"{self.title}: {len(rows)} complete histories for {count} jobs")
        starts = [float(start) for _, start in rows]
        return latency_figure([float(finish) for finish, _ in rows],
                              f"{self.enqueue_api} at {count / elapsed:.1f}/s achieved, {processes} worker"
                              f" processes, submit -> finish ({self.records}); submit -> start p50"
                              f" {1000 * statistics.median(starts):.1f} ms")

    def _cleanup(self) -> None:
        # Idempotent: a failed prepare has cleaned up already when the caller's cleanup runs.
        reader, runner, db = self.reader, self.runner, self.db
        self.reader = self.runner = self.db = None
        try:
            if reader is not None:
                reader.close()
            if runner is not None:
                try:
                    runner.run(self._close())
                finally:
                    runner.close()
        finally:
            if db is not None:
                db.drop()
