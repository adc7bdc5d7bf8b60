"""Processes the tests and benchmarks start: Celery workers, beat, a benchmark run.

Each runs in its own session, so a signal sent to its process group reaches a Celery worker's
pool children too (SIGKILL of the whole worker, SIGSTOP to freeze it). Its output goes to a
log file, which is how we learn that it is ready and, when it dies, why.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.kit.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]


class ProcessDied(RuntimeError):
    """A process exited before it was ready, or while it was still needed."""


class NotReady(RuntimeError):
    """A process did not log what it was waited for in time."""


@dataclass
class LoggedProcess:
    """One started process and the file its stdout and stderr go to."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: float  # time.time(), to tell our pids from later ones that reuse them
    _reaped: bool = field(default=False, repr=False, compare=False)  # killed and waited for

    @classmethod
    def start(cls, name: str, argv: list[str], *, env: dict[str, str], log_dir: Path,
              cwd: Path = REPO_ROOT) -> LoggedProcess:
        """Start ``argv`` in a new session from ``cwd`` (the repository root unless an
        application's own folder), logging to ``<name>.log``."""
        log = log_dir / f"{name}.log"
        started = time.time()
        with log.open("wb") as handle:  # the child keeps its own copy of the descriptor
            popen = subprocess.Popen(argv, env=env, cwd=cwd, stdout=handle,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        return cls(name, popen, log, started)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def has_logged(self, needle: str) -> bool:
        return needle in self.output()

    def wait_for_log(self, needle: str, timeout: float = 30) -> None:
        """Wait until the log holds ``needle`` (a ready line); raise if it exits or times out."""
        def logged() -> bool:
            if self.has_logged(needle):
                return True
            if not self.alive:
                raise ProcessDied(f"{self.name} exited early:\n{self.output()[-3000:]}")
            return False

        wait_until(logged, timeout, interval=0.05, failure=NotReady, what=lambda: (
            f"{self.name}: {needle!r} in its log\n{self.output()[-3000:]}\n"))

    def check_alive(self) -> None:
        if not self.alive:
            raise ProcessDied(f"{self.name} died:\n{self.output()[-3000:]}")

    def signal_group(self, signum: int) -> None:
        """Signal the leader and every process of its group (a worker and its pool children).

        Only while the leader is unreaped: after that its pid, which is the group id, may
        already name somebody else's processes.
        """
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signum)

    def kill(self) -> None:
        """SIGKILL the whole group (continued first, in case it was stopped) and reap it."""
        if self._reaped:
            return
        leader_was_gone = not self.alive
        self.signal_group(signal.SIGCONT)
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
            self._reaped = True
        if leader_was_gone:
            self._kill_orphans()

    def _kill_orphans(self) -> None:
        # A leader that died by itself may leave pool children in its group. A process is taken
        # for ours only if it is still in our group and was born during this process's life.
        for proc in psutil.process_iter(["pid", "create_time"]):
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if (os.getpgid(proc.pid) == self.popen.pid
                        and proc.info["create_time"] >= self.started - 1):
                    proc.kill()


class ProcessSet:
    """The processes one stack or run started, so that it can stop exactly those."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.running: list[LoggedProcess] = []

    def __iter__(self) -> Iterator[LoggedProcess]:
        return iter(list(self.running))

    def __len__(self) -> int:
        return len(self.running)

    def start(self, name: str, argv: list[str], env: dict[str, str], *, ready: str | None = None,
              timeout: float = 60, cwd: Path = REPO_ROOT) -> LoggedProcess:
        """Start a process; with ``ready``, wait until it logs that line."""
        proc = LoggedProcess.start(name, argv, env=env, log_dir=self.log_dir, cwd=cwd)
        self.running.append(proc)
        if ready is not None:
            proc.wait_for_log(ready, timeout=timeout)
        return proc

    def check_alive(self) -> None:
        for proc in self.running:
            proc.check_alive()

    def stop(self, *procs: LoggedProcess) -> None:
        """Kill these processes (SIGKILL: whatever they were doing, nobody waits for it)."""
        for proc in procs:
            proc.kill()
            if proc in self.running:
                self.running.remove(proc)

    def stop_all(self) -> None:
        self.stop(*self.running)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Freeze every process (SIGSTOP) for the block; they carry on when it ends."""
        for proc in self.running:
            proc.signal_group(signal.SIGSTOP)
        try:
            yield
        finally:
            for proc in self.running:
                proc.signal_group(signal.SIGCONT)


def answers_http(url: str) -> bool:
    """Whether a server answers ``url`` at all: any HTTP answer, a 401 or a 404 too, says it
    is serving; a refused or silent connection says it is not (yet)."""
    try:
        urllib.request.urlopen(url, timeout=1).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a server a test starts, or
    one that must refuse connections)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def celery_worker_argv(app_module: str, queue: str, name: str, concurrency: int) -> list[str]:
    """The production worker command (``spacejobs worker``) minus mingle and gossip, which only
    slow the start-up and add chatter between workers that no test or benchmark looks at.

    The worker reads the sweep queue first, as in production, so sweeps are not stuck behind a
    backlog of wake-ups.
    """
    return [sys.executable, "-m", "celery", "-A", app_module, "worker", "--loglevel", "INFO",
            "--pool", "prefork", "-c", str(concurrency), "-Q", f"{queue}.sweep,{queue}",
            "-n", f"{name}@%h", "--without-mingle", "--without-gossip"]


def celery_beat_argv(schedule: Path) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "spacejobs.tasks.celery_app", "beat", "--loglevel", "INFO",
            "--schedule", str(schedule)]


WORKER_READY = "ready."
BEAT_READY = "beat: Starting"


def _raise_system_exit(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def clean_up_on_signals() -> None:
    """Make SIGTERM and SIGHUP raise SystemExit and SIGINT raise KeyboardInterrupt in this
    process, so that a benchmark's ``finally`` stops what it started. A shell starts background
    jobs with SIGINT ignored; Ctrl-C / kill -INT must still clean up."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_system_exit)
    signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def until_stopped(log: Callable[[str], None]) -> Iterator[None]:
    """A benchmark's body: Ctrl-C ends it early (logged, not raised, so the report of what ran
    still prints), SIGTERM and SIGHUP end it too (re-raised after the cleanup). Signals are
    ignored from the moment the body ends, so that the cleanup after it runs to the end."""
    try:
        yield
    except KeyboardInterrupt:
        log("interrupted")
    except SystemExit:
        log("terminated by a signal")
        raise
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
