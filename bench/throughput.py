"""Space Jobs next to plain Celery, PgQueuer and Procrastinate, in one run, on the same servers,
with issue 8's targets.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python -m bench.throughput [--reps 3] [--jobs 5000] [--scale] [--peer NAME ...]
    .venv/bin/python -m bench.throughput --embedded ...   # on servers started for the run

The figures are interleaved (for each repetition, for each system, each figure) so that a busy
moment of this shared machine falls on every system alike; each is reported as the median of
the repetitions, with the single values. Every system runs in a database (or Redis keys) of its
own, on its own defaults (bench/peers/), and every figure is read from the system's records:
for Space Jobs the job rows and job_events, never the workers' reports. ``--scale`` adds what
takes long: a drain with 16 worker processes, the claim cost behind a large history, and the
workers' memory after many jobs. ``--quick`` is a smoke run: small sizes, one repetition.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import redis

from bench.peers import PEERS, Figure, Peer, PeerError, load_peer
from bench.peers.plain_celery import redis_py_url
from bench.servers import add_embedded_option, measured_on
from spacejobs.models.db.engine import libpq_url
from tests.kit.processes import clean_up_on_signals

SPACEJOBS = "spacejobs"
TIMES = "\N{MULTIPLICATION SIGN}"
# For a target whose peer was left out of the run (its driver then never gave its title).
NAMES = {"celery": "plain Celery", "pgqueuer": "PgQueuer", "procrastinate": "Procrastinate"}


@dataclass(frozen=True)
class Measure:
    """One figure of the interleaved repetitions."""

    key: str
    label: str
    take: Callable[[Peer, argparse.Namespace], Figure | None]
    only: str | None = None  # the one peer that has it (Space Jobs' own figures)
    scale: bool = False  # measured only with --scale


MEASURES = [
    Measure("enqueue", "enqueue, one job per call", lambda p, a: p.enqueue_rate(a.jobs)),
    Measure("bulk", "bulk enqueue, 1,000 per call", lambda p, a: p.bulk_enqueue_rate(a.bulk)),
    Measure("web", "web POST …/jobs under wrk",
            lambda p, a: p.web_rate(a.web_seconds, a.web_connections), only=SPACEJOBS),
    Measure("drain", "drain, 2 worker processes", lambda p, a: p.drain_rate(a.jobs, 2)),
    Measure("latency", "latency, paced", lambda p, a: p.latency(a.rate, a.latency_seconds, 2)),
    Measure("fairness", "a lone job behind a flood", lambda p, a: p.fairness(a.flood, 2),
            only=SPACEJOBS),
    Measure("wait", "service.wait after the finish", lambda p, a: p.wait_latency(a.wait_jobs, 2),
            only=SPACEJOBS),
    Measure("drain16", "drain, 16 worker processes", lambda p, a: p.drain_rate(a.jobs, 16),
            only=SPACEJOBS, scale=True),
]


class Results:
    """Every figure measured, by (peer, measure key), in the order of the repetitions."""

    def __init__(self) -> None:
        self.figures: dict[tuple[str, str], list[Figure]] = {}
        self.titles: dict[str, str] = {}
        self.once: dict[str, Figure] = {}  # Space Jobs' scale figures, measured once
        self.failures: list[str] = []

    def add(self, peer: str, key: str, figure: Figure) -> None:
        self.figures.setdefault((peer, key), []).append(figure)

    def median(self, peer: str, key: str, part: str | None = None) -> float | None:
        """The median over the repetitions of the figure's value, or of one of its spread's
        parts (``p95``) or facts (``flood_rate``); None when it was not measured."""
        found = self.figures.get((peer, key))
        if not found:
            return None
        return statistics.median(({**f.spread, **f.facts}[part] if part else f.value) for f in found)


# -- the report's pieces ----------------------------------------------------------------------

def _say(line: str = "") -> None:
    print(line, flush=True)


def _load() -> str:
    return " / ".join(f"{v:.2f}" for v in os.getloadavg())


def machine(admin_url: str, redis_url: str) -> list[str]:
    with psycopg.connect(libpq_url(admin_url)) as conn:
        postgres = conn.execute("SHOW server_version").fetchone()[0]
    redis_version = redis.Redis.from_url(redis_py_url(redis_url)).info("server").get("redis_version", "?")
    command = shlex.join([os.path.basename(sys.executable), "-m", "bench.throughput", *sys.argv[1:]])
    return [f"command   : {command}",
            f"machine   : {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), {platform.system()}"
            f" {platform.release()} {platform.machine()}, Python {platform.python_version()}",
            f"servers   : PostgreSQL {postgres}, Redis {redis_version}; the benchmark, the workers and"
            " both servers share this machine's CPUs",
            f"load      : {_load()} at start (1 / 5 / 15 min)"]


def _values(figures: list[Figure]) -> str:
    if figures[0].spread:
        return ", ".join(f"{f.spread['p50']:.1f}/{f.spread['p95']:.1f}" for f in figures) + " ms p50/p95"
    return ", ".join(f"{f.value:,.0f}" for f in figures) + f" {figures[0].unit}"


def summary(results: Results, peers: list[str]) -> list[str]:
    lines = []
    for measure in MEASURES:
        for peer in peers:
            figures = results.figures.get((peer, measure.key))
            if not figures:
                continue
            if figures[0].spread:
                head = (f"p50 {results.median(peer, measure.key, 'p50'):.1f} ms, p95"
                        f" {results.median(peer, measure.key, 'p95'):.1f} ms")
            else:
                head = f"{results.median(peer, measure.key):,.0f} {figures[0].unit}"
            lines.append(f"  {measure.label:<30} {results.titles[peer]:<28} {head:<28}"
                         f" (each: {_values(figures)})")
    lines += [f"  {label:<30} {results.titles[SPACEJOBS]:<28} {figure}"
              for label, figure in results.once.items()]
    return lines


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FALL SHORT"


def targets(results: Results, args: argparse.Namespace) -> list[str]:
    """Issue 8's targets and issue 18's, each from the medians of this one run. Issue 18 keeps
    three of issue 8's (web 2c, latency 3a/3b, drain 1a/1b: no regression) and sets two of its
    own against PgQueuer (18c enqueue, 18d bulk)."""
    def title(peer: str) -> str:
        return results.titles.get(peer, NAMES.get(peer, peer))

    def missing(*needed: tuple[str, str]) -> str | None:
        absent = [f"{title(peer)} {key}" for peer, key in needed if results.median(peer, key) is None]
        return f"not measured ({', '.join(absent)})" if absent else None

    def ratio(number: str, text: str, key: str, peer: str, factor: float) -> str:
        head = f"target {number} {text} ≥ {factor:g}{TIMES} {title(peer)}"
        if why := missing((SPACEJOBS, key), (peer, key)):
            return f"{head}: {why}"
        mine, theirs = results.median(SPACEJOBS, key), results.median(peer, key)
        return (f"{head}: {mine / theirs:.2f}{TIMES} ({mine:,.0f} vs {theirs:,.0f} jobs/s)"
                f" {_verdict(mine >= factor * theirs)}")

    def absolute(number: str, text: str, key: str, floor: float) -> str:
        head = f"target {number} {text} ≥ {floor:,.0f} jobs/s"
        if why := missing((SPACEJOBS, key)):
            return f"{head}: {why}"
        mine = results.median(SPACEJOBS, key)
        return f"{head}: {mine:,.0f} jobs/s {_verdict(mine >= floor)}"

    def latency(number: str, part: str, margin: float) -> str:
        head = f"target {number} latency {part} ≤ {title('celery')} {part} + {margin:g} ms"
        if why := missing((SPACEJOBS, "latency"), ("celery", "latency")):
            return f"{head}: {why}"
        mine = results.median(SPACEJOBS, "latency", part)
        theirs = results.median("celery", "latency", part)
        return (f"{head}: {mine:.1f} vs {theirs:.1f} ms ({mine - theirs:+.1f} ms)"
                f" {_verdict(mine <= theirs + margin)}")

    lines = [ratio("1a", "drain", "drain", "pgqueuer", 1.1),
             ratio("1b", "drain", "drain", "celery", 5),
             ratio("2a", "enqueue (Python API, one process)", "enqueue", "pgqueuer", 1.0),
             absolute("2b", "bulk submit, 1,000 per call", "bulk", 20_000),
             absolute("2c", "web POST through gunicorn under wrk", "web", 1_000),
             latency("3a", "p50", 1),
             latency("3b", "p95", 2),
             ratio("18c", "enqueue (Python API, one process)", "enqueue", "pgqueuer", 0.8),
             ratio("18d", "bulk submit, 1,000 per call", "bulk", "pgqueuer", 0.5),
             *framework(results)]
    if not args.scale:
        return [*lines, "target 4a-4c (claim cost, 16-process drain, worker RSS): not measured"
                        " (--scale)"]
    empty, loaded = results.once.get("claim cost, empty table"), results.once.get("claim cost, loaded")
    head = (f"target 4a claim with {args.claim_finished:,} finished + {args.claim_queued:,} queued"
            f" ≤ 1.2{TIMES} empty")
    if empty and loaded:
        lines.append(f"{head}: {loaded.value / empty.value:.2f}{TIMES} ({loaded.value:.2f} vs"
                     f" {empty.value:.2f} ms) {_verdict(loaded.value <= 1.2 * empty.value)}")
    else:
        lines.append(f"{head}: not measured")
    head = f"target 4b drain, 16 processes ≥ 0.9{TIMES} 2 processes"
    if why := missing((SPACEJOBS, "drain16"), (SPACEJOBS, "drain")):
        lines.append(f"{head}: {why}")
    else:
        many, two = results.median(SPACEJOBS, "drain16"), results.median(SPACEJOBS, "drain")
        lines.append(f"{head}: {many / two:.2f}{TIMES} ({many:,.0f} vs {two:,.0f} jobs/s)"
                     f" {_verdict(many >= 0.9 * two)}")
    rss = results.once.get(f"worker RSS after {args.rss_jobs:,} jobs")
    head = f"target 4c worker RSS after {args.rss_jobs:,} jobs ≤ 120 MB per process"
    lines.append(f"{head}: largest {rss.value:.1f} MB {_verdict(rss.value <= 120)}" if rss
                 else f"{head}: not measured")
    return lines


def framework(results: Results) -> list[str]:
    """Issue 11's two figures: the fairness bound and how soon ``wait`` returns."""
    lines = []
    head = "issue 11 a lone job behind a flood waits < 1 s while the flood drains ≥ 1,000 jobs/s"
    wait, rate = results.median(SPACEJOBS, "fairness"), results.median(SPACEJOBS, "fairness", "flood_rate")
    lines.append(f"{head}: not measured" if wait is None else
                 f"{head}: {wait:,.1f} ms at {rate:,.0f} jobs/s {_verdict(wait < 1000 and rate >= 1000)}")
    head = "issue 11 service.wait returns within 50 ms of the finish (p95)"
    p95 = results.median(SPACEJOBS, "wait", "p95")
    lines.append(f"{head}: not measured" if p95 is None else
                 f"{head}: p50 {results.median(SPACEJOBS, 'wait'):.1f} / p95 {p95:.1f} ms"
                 f" {_verdict(p95 <= 50)}")
    return lines


# -- the run ----------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes, 1 repetition")
    parser.add_argument("--reps", type=int, help="repetitions (default 3; 1 with --quick)")
    parser.add_argument("--peer", action="append", choices=sorted(PEERS),
                        help="only this system (repeatable; default: all)")
    parser.add_argument("--jobs", type=int, help="N for enqueue and drain (default 5000; 500 with --quick)")
    parser.add_argument("--bulk", type=int, help="jobs for the bulk figure, 1,000 per call (default"
                                                  " 20000; 2000 with --quick)")
    parser.add_argument("--rate", type=float, default=50, help="paced rate for latency (per second)")
    parser.add_argument("--latency-seconds", type=float,
                        help="length of each paced latency run (default 20; 3 with --quick)")
    parser.add_argument("--web-seconds", type=float, help="wrk's run (default 10; 2 with --quick)")
    parser.add_argument("--web-connections", type=int, default=32, help="wrk's keep-alive connections")
    parser.add_argument("--flood", type=int,
                        help="the flood a lone job waits behind (default 10000; 5000 with --quick)")
    parser.add_argument("--wait-jobs", type=int,
                        help="jobs waited for one at a time (default 200; 20 with --quick)")
    parser.add_argument("--scale", action="store_true",
                        help="also the 16-process drain, the claim cost and the workers' RSS")
    parser.add_argument("--claim-finished", type=int,
                        help="finished rows for the claim cost (default 1000000; 20000 with --quick)")
    parser.add_argument("--claim-queued", type=int,
                        help="queued rows for the claim cost (default 100000; 2000 with --quick)")
    parser.add_argument("--claim-samples", type=int, default=200, help="claims timed per table")
    parser.add_argument("--rss-jobs", type=int,
                        help="jobs drained before reading RSS (default 100000; 2000 with --quick)")
    add_embedded_option(parser)
    args = parser.parse_args(argv)
    quick = args.quick

    def pick(value: Any, full: Any, small: Any) -> Any:
        return value if value is not None else (small if quick else full)

    args.reps = pick(args.reps, 3, 1)
    args.jobs = pick(args.jobs, 5000, 500)
    args.bulk = pick(args.bulk, 20_000, 2000)
    args.flood = pick(args.flood, 10_000, 5000)
    args.wait_jobs = pick(args.wait_jobs, 200, 20)
    args.latency_seconds = pick(args.latency_seconds, 20, 3)
    args.web_seconds = pick(args.web_seconds, 10, 2)
    args.claim_finished = pick(args.claim_finished, 1_000_000, 20_000)
    args.claim_queued = pick(args.claim_queued, 100_000, 2000)
    args.rss_jobs = pick(args.rss_jobs, 100_000, 2000)
    if min(args.reps, args.jobs, args.bulk, args.rss_jobs) < 1 or args.rate <= 0:
        parser.error("--reps, --jobs, --bulk, --rss-jobs and --rate must be positive")
    args.peer = args.peer or list(PEERS)
    return args


def prepare(names: list[str], admin_url: str, redis_url: str, results: Results) -> dict[str, Peer]:
    """Every peer that can run here; one whose package is missing is left out, and said so."""
    run_id = uuid.uuid4().hex[:8]
    ready = {}
    for name in names:
        try:
            peer = load_peer(name)
        except ImportError as error:
            _say(f"  {name}: left out, not importable ({error}); pip install -e '.[bench]'")
            continue
        _say(f"  {peer.title}: {peer.defaults}")
        try:
            peer.prepare(admin_url, redis_url, run_id)
        except Exception as error:
            results.failures.append(f"{peer.title}: prepare failed: {error}")
            _say(f"  {peer.title}: prepare FAILED: {error}")
            continue
        ready[name] = peer
        results.titles[name] = peer.title
    return ready


def measure(results: Results, peer: Peer, name: str, label: str,
            take: Callable[[], Figure | None]) -> Figure | None:
    """One figure; a failure is reported and counted, and the run goes on."""
    try:
        figure = take()
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as error:
        results.failures.append(f"{peer.title} {label}: {error}")
        detail = str(error) if isinstance(error, PeerError) else traceback.format_exc()
        _say(f"    {label:<30} {peer.title:<28} FAILED: {detail.strip()[-2000:]}")
        return None
    if figure is not None:
        _say(f"    {label:<30} {peer.title:<28} {figure}")
    return figure


def run(args: argparse.Namespace, peers: dict[str, Peer], results: Results) -> None:
    for rep in range(1, args.reps + 1):
        _say(f"\nrepetition {rep} of {args.reps} (load {_load()})")
        for name, peer in peers.items():
            for each in MEASURES:
                if (each.only and each.only != name) or (each.scale and not args.scale):
                    continue
                figure = measure(results, peer, name, each.label, lambda e=each, p=peer: e.take(p, args))
                if figure is not None:
                    results.add(name, each.key, figure)
    if args.scale and (sj := peers.get(SPACEJOBS)):
        _say(f"\nscale, Space Jobs alone, once (load {_load()})")
        for label, take in (
                ("claim cost, empty table", lambda: sj.claim_cost(0, 0, args.claim_samples).hit),
                ("claim cost, loaded", lambda: sj.claim_cost(args.claim_finished, args.claim_queued,
                                                             args.claim_samples).hit),
                (f"worker RSS after {args.rss_jobs:,} jobs", lambda: sj.rss_after(args.rss_jobs))):
            if (figure := measure(results, sj, SPACEJOBS, label, take)) is not None:
                results.once[label] = figure


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    clean_up_on_signals()
    with measured_on(args.embedded) as (admin_url, redis_url):
        return measure_all(args, admin_url, redis_url)


def measure_all(args: argparse.Namespace, admin_url: str, redis_url: str) -> int:
    """The whole run on the given servers: the header, the repetitions, the report."""
    _say("Space Jobs and its peers, one run (issue 8)")
    for line in machine(admin_url, redis_url):
        _say(line)
    _say(f"sizes     : {args.reps} repetition(s); N={args.jobs:,} for enqueue and drain, bulk {args.bulk:,},"
         f" latency at {args.rate:g}/s for {args.latency_seconds:g} s, wrk {args.web_seconds:g} s with"
         f" {args.web_connections} connections" + (
             f"; scale: claim cost {args.claim_finished:,} finished + {args.claim_queued:,} queued rows,"
             f" RSS after {args.rss_jobs:,} jobs" if args.scale else ""))
    _say("systems, as they run:")
    results = Results()
    peers: dict[str, Peer] = {}
    interrupted = False
    try:
        peers = prepare(args.peer, admin_url, redis_url, results)
        run(args, peers, results)
    except KeyboardInterrupt:
        interrupted = True
        _say("\ninterrupted: what was measured so far follows")
    finally:
        for peer in peers.values():
            try:
                peer.cleanup()
            except Exception as error:
                results.failures.append(f"{peer.title} cleanup: {error}")
    _say(f"\nmedians of {args.reps} repetition(s)")
    for line in summary(results, list(peers)):
        _say(line)
    _say("\ntargets (issues 8, 11 and 18; issue 18's are 1a, 1b, 2c, 3a, 3b, 18c and 18d), from"
         " the medians above")
    for line in targets(results, args):
        _say(line)
    _say(f"\nload      : {_load()} at end (1 / 5 / 15 min)")
    for failure in results.failures:
        _say(f"FAILED: {failure.splitlines()[0]}")
    return 1 if results.failures or interrupted or not peers else 0


if __name__ == "__main__":
    sys.exit(main())
