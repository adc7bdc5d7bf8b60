"""What every benchmark measures with: waiting for a condition under a deadline, pacing calls,
the one percentile definition, driving ``wrk``, and where raw output goes.

Percentiles: **linear interpolation between the closest ranks** (the "inclusive" method of
``statistics.quantiles``, numpy's default, R's type 7). Of the two definitions the benchmarks
had, this is the one kept because a figure's p50 is then the same number as ``statistics.median``
of its samples, which every benchmark already uses for its medians of repetitions and of
round trips; and because the published reference figures of ``bench.throughput`` were computed
this way. Nearest rank (always an observed sample) moves a p50 by up to half the gap between the
two middle samples, and a p95 in steps of whole samples: coarse for the few hundred samples a
latency run has.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

# -- waiting ----------------------------------------------------------------------------------


class Deadline:
    """A moment ``seconds`` from now on the monotonic clock, shared by several waits."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def passed(self) -> bool:
        return time.monotonic() > self.at


def poll(done: Callable[[], object], within: float | Deadline, *, interval: float = 0.1,
         between: Callable[[], None] | None = None) -> bool:
    """Call ``done`` every ``interval`` seconds until it is true (True) or the deadline has
    passed (False). ``between`` runs after each false answer, before the deadline is looked at:
    a check that raises (a worker died) ends the wait at once."""
    deadline = within if isinstance(within, Deadline) else Deadline(within)
    while not done():
        if between is not None:
            between()
        if deadline.passed():
            return False
        time.sleep(interval)
    return True


def paced(rate: float, count: int, send: Callable[[], object]) -> float:
    """Call ``send`` ``count`` times on a fixed schedule of ``rate`` per second; a late call is
    made at once, never skipped, so a slow sender shows as a lower achieved rate. Returns the
    elapsed seconds."""
    start = time.perf_counter()
    for index in range(count):
        delay = start + index / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send()
    return time.perf_counter() - start


# -- percentiles ------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (0 to 100) of ``values``, interpolated linearly between the two
    closest ranks (the module's docstring says why this definition)."""
    if not values:
        raise ValueError("a percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} is outside 0..100")
    ordered = sorted(values)
    position = p / 100 * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def spread(values: list[float]) -> dict[str, float]:
    """p50, p95, p99 and max: what a latency figure prints."""
    return {"p50": percentile(values, 50), "p95": percentile(values, 95),
            "p99": percentile(values, 99), "max": max(values)}


# -- wrk --------------------------------------------------------------------------------------

WRK_MISSING = "needs wrk (apt-get install wrk)"


class WrkError(RuntimeError):
    """wrk is missing or exited with a failure."""


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


@dataclass(frozen=True)
class WrkReport:
    """What wrk printed at the end of a run; a line it left out reads as its zero (or ``?``)."""

    requests_per_second: float
    answered: int  # requests that got an answer ("N requests in ...")
    not_2xx: int  # of those, answers that were not 2xx or 3xx
    socket_errors: str  # wrk's own summary ("connect 0, read 1, write 0, timeout 3") or "none"
    p50: str  # with --latency: the latency distribution's lines, as wrk wrote them
    p99: str
    output: str


def parse_wrk(output: str) -> WrkReport:
    """The figures of wrk's report on stdout."""
    def found(pattern: str) -> str | None:
        match = re.search(pattern, output)
        return match.group(1).strip() if match else None

    return WrkReport(requests_per_second=float(found(r"Requests/sec:\s+([\d.]+)") or 0),
                     answered=int(found(r"(\d+) requests in") or 0),
                     not_2xx=int(found(r"Non-2xx or 3xx responses: (\d+)") or 0),
                     socket_errors=found(r"Socket errors: (.*)") or "none",
                     p50=found(r"50%\s+(\S+)") or "?", p99=found(r"99%\s+(\S+)") or "?",
                     output=output)


def post_script(directory: Path, name: str, body: str, token: str) -> Path:
    """A wrk Lua script that POSTs ``body`` as JSON with a bearer ``token``; ``body`` must not
    hold a single quote (it is written into a Lua string as it is)."""
    script = directory / f"{name}.lua"
    script.write_text('wrk.method = "POST"\n'
                      f"wrk.body = '{body}'\n"
                      'wrk.headers["Content-Type"] = "application/json"\n'
                      f'wrk.headers["Authorization"] = "Bearer {token}"\n')
    return script


def run_wrk(url: str, script: Path, *, seconds: float, connections: int, threads: int = 2,
            latency: bool = False) -> WrkReport:
    """One wrk run against ``url`` with keep-alive ``connections`` for ``seconds`` (whole, at
    least 1), ``threads`` threads, the requests ``script`` makes; ``latency`` adds the latency
    distribution to the report."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise WrkError(WRK_MISSING)
    whole = max(1, round(seconds))
    argv = [wrk, f"-t{threads}", f"-c{connections}", f"-d{whole}s", *(["--latency"] if latency else []),
            "-s", str(script), url]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=whole + 60)
    if done.returncode != 0:
        raise WrkError(f"wrk exited with {done.returncode}: {done.stderr[-1500:]}")
    return parse_wrk(done.stdout)


# -- raw output -------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
#: Where a benchmark writes raw output (profiles, logs) when not told where: git-ignored, outside
#: docs/, so that nothing the documentation site builds from is a raw profile (bench/README.md).
RAW_OUTPUT = ROOT / ".bench"


def raw_output_dir(name: str) -> Path:
    """A new directory for one run's raw output: ``.bench/<name>-<UTC time>-<commit>``."""
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True, check=False)
    commit = found.stdout.strip() or "nogit"
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return RAW_OUTPUT / f"{name}-{stamp}-{commit}"
