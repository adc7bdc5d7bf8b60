"""The chaos side of the run: the worker and beat processes, and a driver thread that kills
workers, stalls one past its lease and restarts each server once, on a schedule tied to how
far the submissions have gone."""

from __future__ import annotations

import contextlib
import random
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psutil
import redis

from bench.harness import Deadline, poll
from tests.kit.private_servers import PrivateServers
from tests.kit.processes import (
    BEAT_READY,
    WORKER_READY,
    LoggedProcess,
    celery_beat_argv,
    celery_worker_argv,
)
from tests.kit.stack import Stack

if TYPE_CHECKING:
    from bench.chaos.partitions import Partitions

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
# What tasks/runner.py logs when the fence turns down a stale attempt; the worker logs are
# counted for these lines.
STALE_FINISH = "stale finish discarded"
STALE_STOPPED = "lease lost to a newer attempt"
STALE_FAILURE = "failure of a stale attempt discarded"


class ChaosError(RuntimeError):
    pass


def log(message: str) -> None:
    # Progress on stderr; stdout carries only the report.
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Incarnation(LoggedProcess):
    """One life of a worker slot (or of beat): from its start to its SIGKILL or the end."""

    ready_text: str = WORKER_READY
    ended: float | None = None
    killed: bool = False  # by us, on purpose
    pids: set[int] = field(default_factory=set)
    _ready: bool = False

    @property
    def ready(self) -> bool:
        if not self._ready:
            self._ready = self.has_logged(self.ready_text)
        return self._ready

    def note_pids(self) -> None:
        # Pool children are forked (and replaced) by the worker: remember every one, because the
        # database names them, not the main process, as the actor of a claim.
        if not self.alive:
            return  # reaped: its pid may already name another process
        with contextlib.suppress(psutil.Error):
            main = psutil.Process(self.pid)
            self.pids.add(main.pid)
            self.pids.update(child.pid for child in main.children(recursive=True))

    def kill(self) -> None:
        self.note_pids()
        super().kill()
        if self.ended is None:
            self.ended = time.time()

    def exit_note(self) -> str:
        """Who died by itself, when, and the line its log gives as the reason, if any."""
        reason = next((line.strip() for line in self.output().splitlines()
                       if "Unrecoverable error" in line or " CRITICAL " in line), "no reason logged")
        return (f"{self.name} exited by itself with status {self.popen.returncode} "
                f"(noticed {time.strftime('%H:%M:%S')}): {reason[:300]}")


class Fleet:
    """The worker slots and beat. Only the chaos thread and the final cleanup touch them."""

    def __init__(self, stack: Stack, *, workers: int, concurrency: int,
                 hosts: list[tuple[list[str], dict[str, str]]] | None = None) -> None:
        self.stack = stack
        self.env = stack.env()
        # Per slot: the command prefix that runs it on its own "host" (``ip netns exec``) and
        # the environment that points it at the servers from there (--partitions); none: here.
        self.hosts = hosts or [([], self.env)] * workers
        self.concurrency = concurrency
        self.queue = stack.queue
        self.slots: list[Incarnation | None] = [None] * workers
        self.history: list[Incarnation] = []
        self.beat: Incarnation | None = None
        self.unexpected_exits: list[str] = []
        self._lock = threading.Lock()
        self._closed = False

    def _spawn(self, name: str, argv: list[str], ready_text: str,
               env: dict[str, str] | None = None) -> Incarnation:
        incarnation = Incarnation.start(name, argv, env=env or self.env, log_dir=self.stack.log_dir)
        assert isinstance(incarnation, Incarnation)
        incarnation.ready_text = ready_text
        self.history.append(incarnation)
        return incarnation

    def start_worker(self, slot: int) -> Incarnation | None:
        with self._lock:
            if self._closed:
                return None
            lives = sum(1 for i in self.history if i.name.startswith(f"w{slot}."))
            name = f"w{slot}.{lives}"
            prefix, env = self.hosts[slot]
            incarnation = self._spawn(name, prefix + celery_worker_argv(
                "spacejobs.tasks.celery_app", self.queue, f"{name}-{uuid.uuid4().hex[:6]}", self.concurrency),
                WORKER_READY, env)
            self.slots[slot] = incarnation
            return incarnation

    def start_beat(self) -> Incarnation:
        with self._lock:
            self.beat = self._spawn("beat", celery_beat_argv(self.stack.log_dir / "beat.schedule"),
                                    BEAT_READY)
            return self.beat

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = Deadline(timeout)
        for incarnation in [*self.slots, self.beat]:
            assert incarnation is not None
            poll(lambda i=incarnation: i.ready or not i.alive, deadline)
            if not incarnation.ready:
                why = "not ready" if incarnation.alive else "exited early"
                raise ChaosError(f"{incarnation.name} {why}:\n{incarnation.output()[-3000:]}")

    def ready_workers(self) -> list[int]:
        return [i for i, inc in enumerate(self.slots) if inc is not None and inc.alive and inc.ready]

    def workers(self) -> list[Incarnation]:
        """Every worker life so far, killed or not."""
        return [i for i in self.history if i is not self.beat]

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
                self.unexpected_exits.append(incarnation.exit_note())
                self.start_worker(slot)
        if self.beat is not None and not self.beat.alive and self.beat.ended is None:
            self.beat.ended = time.time()
            self.unexpected_exits.append(self.beat.exit_note())

    def close(self) -> None:
        with self._lock:
            self._closed = True
        for incarnation in self.history:
            incarnation.kill()


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

    def __init__(self, fleet: Fleet, servers: PrivateServers | None, progress: Callable[[], float], *,
                 rng: random.Random, kill_every: float, max_kills: int | None, outage: float,
                 restart_redis: bool, restart_pg: bool, stalls: int,
                 lease_holders: Callable[[], dict[int, list[str]]],
                 partitions: Partitions | None = None) -> None:
        super().__init__(name="chaos-driver", daemon=True)
        self.partitions = partitions
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
            if self.partitions is not None:
                self.partitions.heal_all()

    def busy(self) -> bool:
        """A server restart or a cut still to come or to heal: the run waits for it."""
        return bool(self.pending) or (self.partitions is not None and self.partitions.busy())

    def _spared(self) -> set[int]:
        """Slots neither killed nor stalled: the stalled one, and cut hosts (--partitions)."""
        spared = {i for i, inc in enumerate(self.fleet.slots)
                  if self.stalled is not None and inc is self.stalled[0]}
        if self.partitions is not None:
            spared |= self.partitions.protected()
        return spared

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
            if self.partitions is not None:
                self.partitions.tick(done, self.stalled[0] if self.stalled else None)
            if self.pending and done >= self.pending[0][1]:
                self._restart(self.pending.pop(0)[0])
                continue
            chaos_on = 0.05 <= done < 1.0
            if not chaos_on or now < self._pause_until:
                next_kill = max(next_kill, now + self._interval())
                continue
            if now >= next_kill and (self.max_kills is None or self.kills < self.max_kills):
                # A stalled or cut worker is left alone: killing it would spare it the fence
                # under test.
                spared = self._spared()
                ready = [i for i in self.fleet.ready_workers() if i not in spared]
                if ready:
                    slot = self.rng.choice(ready)
                    self.fleet.kill_and_replace(slot)
                    self.kills += 1
                next_kill = now + self._interval()

    def _stall(self, now: float) -> bool:
        """Freeze a worker that holds a lease right now: an idle one would prove nothing."""
        holders = self.lease_holders()
        spared = self._spared()
        busy = [inc for i in self.fleet.ready_workers()
                if i not in spared and (inc := self.fleet.slots[i]) is not None
                and inc.pids & holders.keys()]
        if not busy:
            return False
        worker = self.rng.choice(busy)
        worker.signal_group(signal.SIGSTOP)
        self.stalled = (worker, now + STALL_SECONDS)
        self.stalls_done += 1
        held = [job for pid in worker.pids for job in holders.get(pid, [])]
        self.stall_log.append(Stall(worker.name, time.time(), time.time() + STALL_SECONDS, held))
        log(f"stalled {worker.name} (SIGSTOP) for {STALL_SECONDS:g} s")
        return True

    def _resume(self) -> None:
        if self.stalled is not None:
            self.stalled[0].signal_group(signal.SIGCONT)
            self.stall_log[-1].resumed = time.time()
            self.stalled = None

    def _interval(self) -> float:
        return self.kill_every * self.rng.uniform(0.5, 1.5)

    def _restart(self, server: str) -> None:
        assert self.servers is not None, "no restartable servers (--partitions runs on a cluster)"
        survivors = [self.fleet.slots[i] for i in self.fleet.ready_workers()]
        beat = self.fleet.beat
        dropped = None
        if server == "Redis":
            with contextlib.suppress(redis.RedisError):
                dropped = self.servers.redis.client().llen(self.fleet.queue)
        began = time.time()
        log(f"restarting {server} ({self.outage:g} s down)")
        if server == "Redis":
            done = self.servers.crash_and_restart_redis(self.outage)
        else:
            done = self.servers.restart_postgres(self.outage)
        if not done:
            return
        ended = time.time()
        offset = beat.log.stat().st_size if beat is not None and beat.log.exists() else 0
        self.restarts.append(Restart(server, self.outage, began, ended,
                                     [s for s in survivors if s is not None], offset, dropped))
        self._pause_until = time.monotonic() + SETTLE_AFTER_RESTART
        log(f"{server} is back after {ended - began:.1f} s")
