"""What ``spacejobs demo`` keeps in its data directory while it runs, how it knows the web is
up, and how it stops: the servers' URLs in ``servers.env``, a temporary directory of its own
(``tmp/``, so that nothing of the demo is left in the system's after Ctrl-C), a poll of the
web's URL before the banner says it is running, and its processes stopped one after the other,
the worker given the time its running jobs are promised (``SPACEJOBS_SHUTDOWN_GRACE``)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

#: the file of the servers' URLs, in the data directory
SERVERS_FILE = "servers.env"
#: the file the demo's processes log to, in the data directory (the terminal keeps the banner)
LOG_FILE = "demo.log"
#: the demo's temporary directory (TMPDIR of the demo and of its processes), in the data directory
TMP_DIR = "tmp"
#: what the demo polls until the web answers: public, no database query, not rate-limited
READY_PATH = "/api/v1/openapi.json"


class WebDidNotStart(RuntimeError):
    pass


def write_servers_file(data_dir: Path, values: dict[str, str]) -> Path:
    """``KEY=value`` lines, shell-quoted, that a shell can source (``set -a; . FILE; set +a``)
    and a script can read (python-dotenv, or split at the first ``=`` and unquote with shlex).
    Only its owner may read it: a given ``DATABASE_URL`` may hold a password."""
    path = data_dir / SERVERS_FILE
    lines = ["# The servers of the running `spacejobs demo` (removed when it stops)."]
    lines += [f"{key}={shlex.quote(value)}" for key, value in values.items()]
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    os.chmod(path, 0o600)  # a file left by an older run keeps its mode through O_TRUNC
    return path


@contextlib.contextmanager
def private_tmp(data_dir: Path) -> Iterator[Path]:
    """``data_dir/tmp`` as the temporary directory of this process and of every process it
    starts from here on (TMPDIR): redis, PostgreSQL's tools, beat's schedule file, gunicorn's
    and Celery's files. Removed, with whatever is in it, on the way out."""
    scratch = data_dir / TMP_DIR
    shutil.rmtree(scratch, ignore_errors=True)  # a run killed with SIGKILL left it
    scratch.mkdir(mode=0o700, parents=True)
    saved_env, saved_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = str(scratch)
    tempfile.tempdir = str(scratch)
    try:
        yield scratch
    finally:
        tempfile.tempdir = saved_tempdir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(scratch, ignore_errors=True)


def local_url(host: str, port: int) -> str:
    """The URL to reach a server bound to ``host`` from this machine (a wildcard address is
    reached on the loopback)."""
    reach = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104
    return f"http://[{reach}]:{port}" if ":" in reach else f"http://{reach}:{port}"


def wait_until_answers(base: str, children: list[subprocess.Popen[bytes]], *,
                       timeout: float = 120.0) -> None:
    """Return once ``base`` answers :data:`READY_PATH` with a 200; raise if a child exits first
    or the time is up."""
    # No proxy: an HTTP_PROXY of the environment would be asked for our own loopback.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    while True:
        try:
            with opener.open(base + READY_PATH, timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet, or not answering yet
        if any(child.poll() is not None for child in children):
            raise WebDidNotStart("a demo process exited before the web answered")
        if time.monotonic() > deadline:
            raise WebDidNotStart(f"the web did not answer at {base} within {timeout:.0f} s")
        time.sleep(0.2)


#: beyond the worker's grace: its pool child hears of the stop when the pool closes (up to a
#: second later), the job's next checkpoint comes, and the release is written
WORKER_STOP_MARGIN = 15.0


@dataclass
class DemoProcess:
    """One process the demo started (in a session of its own) and how long it may take to stop."""

    name: str
    popen: subprocess.Popen[bytes]
    #: seconds between SIGTERM and SIGKILL
    stop_within: float


def stop_in_order(processes: list[DemoProcess], say: Callable[[str], None],
                  hurry: Callable[[], bool] = lambda: False) -> None:
    """SIGTERM every process's group at once (the worker hears of the stop at once, and its
    grace starts then), then wait for each in turn, up to its ``stop_within``, and SIGKILL
    whatever is left of its group. The worker lets its running jobs go on for the grace and
    gives back (queued again at once, the attempt not counted) what has not finished: so the
    caller's "stopped." comes only once every job is finished or queued. ``hurry()`` true (a
    second Ctrl-C) kills the rest at once; their running jobs then wait for their leases."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.popen.pid, signal.SIGTERM)
    for process in processes:
        if process.popen.poll() is None and process.stop_within > 15:
            say(f"stopping the {process.name}: up to {process.stop_within:.0f} s for its "
                "running jobs to end or be given back (Ctrl-C again to kill it now)")
        deadline = time.monotonic() + process.stop_within
        while process.popen.poll() is None and time.monotonic() < deadline and not hurry():
            time.sleep(0.1)
        if process.popen.poll() is None:
            say(f"the {process.name} did not stop in time; killing it "
                "(a job it was running is taken again once its lease runs out)")
        # Whatever is left in the process's session (a pool child, say) goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.popen.wait(timeout=5)


def tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log file (what a process said before it exited)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
