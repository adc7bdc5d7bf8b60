"""The command line of ``python -m bench.waiting``: the header, the figures, one line per target."""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench.waiting
from bench.servers import add_embedded_option, measured_on
from bench.waiting import targets
from bench.waiting.figures import (
    BenchError,
    CancelFigure,
    ChainFigure,
    DrainFigure,
    GroupFigure,
    WaitingBench,
    median,
    say,
)
from spacejobs.models.kinds import load_kinds
from spacejobs.models.settings import Settings, reload_settings
from tests.kit.private_servers import RestartableRedis
from tests.kit.processes import clean_up_on_signals
from tests.kit.servers import Servers
from tests.kit.stack import Stack

FIGURES = ("slots", "fanout", "chain", "group", "cancel", "timers")
DEFAULT_SWEEP_INTERVAL: float = Settings.model_fields["sweep_interval"].default
DEFAULT_TIMER_INTERVAL: float = Settings.model_fields["timer_interval"].default
KIND_MODULE = "bench.waiting.kinds"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.waiting", description=bench.waiting.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes")
    parser.add_argument("--only", action="append", choices=FIGURES,
                        help="only this figure (repeatable; default: all)")
    parser.add_argument("--jobs", type=int, help="waiting jobs of the slots figure (default 10000;"
                                                  " 500 with --quick)")
    parser.add_argument("--samples", type=int, help="CPU readings per state (default 3; 2 with --quick)")
    parser.add_argument("--cpu-seconds", type=float, help="each CPU reading's length (default 10;"
                                                           " 2 with --quick)")
    parser.add_argument("--timers", type=int, help="timers per timer figure (default 200; 50 with"
                                                    " --quick)")
    parser.add_argument("--spread", type=float, help="seconds the spread timers are due over"
                                                      " (default 60; 5 with --quick)")
    parser.add_argument("--lead", type=float, help="seconds from the submit to the first due moment"
                                                    " (default 5; 3 with --quick)")
    parser.add_argument("--patience", type=float,
                        help="seconds after the last due moment before a timer counts as not"
                             " completed (default max(10, 3 sweep intervals))")
    parser.add_argument("--children", type=int, help="the fan-out's children and the plain drain's"
                                                      " jobs (default 1000; 200 with --quick)")
    parser.add_argument("--max-parallel", type=int, default=50, help="the fan-out's children at a time")
    parser.add_argument("--reps", type=int, help="fan-out and plain drain pairs, and chains"
                                                  " (default 3; 1 with --quick)")
    parser.add_argument("--steps", type=int, help="the chain's steps (default 200; 20 with --quick)")
    parser.add_argument("--group-seconds", type=float, help="each of the group's two steps' work"
                                                             " (default 4; 1 with --quick)")
    parser.add_argument("--burst", type=int, help="short jobs drained just before each group"
                                                   " (default 500; 100 with --quick)")
    parser.add_argument("--running-for", type=float, help="seconds the grandchild runs before its"
                        " workflow is cancelled (default 2; 1 with --quick)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (Celery main processes)")
    parser.add_argument("--concurrency", type=int, default=2, help="prefork pool size of each worker")
    parser.add_argument("--sweep-interval", type=float, default=DEFAULT_SWEEP_INTERVAL,
                        help="SPACEJOBS_SWEEP_INTERVAL of beat (default: the product's,"
                             f" {DEFAULT_SWEEP_INTERVAL:g} s)")
    parser.add_argument("--timer-interval", type=float, default=DEFAULT_TIMER_INTERVAL,
                        help="SPACEJOBS_TIMER_INTERVAL of beat, its rounds of due timers between"
                             f" sweeps (default: the product's, {DEFAULT_TIMER_INTERVAL:g} s; at"
                             " most 60)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the directory with every log")
    add_embedded_option(parser)
    args = parser.parse_args(argv)

    def pick(value: Any, full: Any, small: Any) -> Any:
        return value if value is not None else (small if args.quick else full)

    args.jobs = pick(args.jobs, 10_000, 500)
    args.samples = pick(args.samples, 3, 2)
    args.cpu_seconds = pick(args.cpu_seconds, 10.0, 2.0)
    args.timers = pick(args.timers, 200, 50)
    args.spread = pick(args.spread, 60.0, 5.0)
    args.lead = pick(args.lead, 5.0, 3.0)
    args.patience = pick(args.patience, max(10.0, 3 * args.sweep_interval),
                         max(5.0, 3 * args.sweep_interval))
    args.children = pick(args.children, 1000, 200)
    args.reps = pick(args.reps, 3, 1)
    args.steps = pick(args.steps, 200, 20)
    args.group_seconds = pick(args.group_seconds, 4.0, 1.0)
    args.burst = pick(args.burst, 500, 100)
    args.running_for = pick(args.running_for, 2.0, 1.0)
    args.only = args.only or list(FIGURES)
    if min(args.jobs, args.samples, args.timers, args.children, args.reps, args.workers,
           args.concurrency, args.max_parallel, args.steps, args.burst) < 1:
        parser.error("the sizes must be positive")
    if (min(args.cpu_seconds, args.sweep_interval, args.timer_interval, args.group_seconds) <= 0
            or args.spread < 0 or args.lead < 0 or args.running_for < 0):
        parser.error("--cpu-seconds, --sweep-interval, --timer-interval and --group-seconds must"
                     " be positive, --spread, --lead and --running-for not negative")
    if args.group_seconds > 60:
        parser.error("--group-seconds is at most 60 (bench.sleep's bound)")
    if args.timer_interval > 60:
        parser.error("--timer-interval is at most 60 (SPACEJOBS_TIMER_INTERVAL's bound)")
    return args


def _out(line: str = "") -> None:
    print(line, flush=True)


def _load() -> str:
    return " / ".join(f"{v:.2f}" for v in os.getloadavg())


def header(args: argparse.Namespace, servers: Servers, redis: RestartableRedis) -> list[str]:
    command = shlex.join([os.path.basename(sys.executable), "-m", "bench.waiting", *sys.argv[1:]])
    redis_version = redis.client().info("server").get("redis_version", "?")
    default = "the product's default" if args.sweep_interval == DEFAULT_SWEEP_INTERVAL else (
        f"the product's default is {DEFAULT_SWEEP_INTERVAL:g} s")
    timer_default = ("the product's default" if args.timer_interval == DEFAULT_TIMER_INTERVAL
                     else f"the product's default is {DEFAULT_TIMER_INTERVAL:g} s")
    return [
        f"command   : {command}",
        f"machine   : {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), {platform.system()}"
        f" {platform.release()}, Python {platform.python_version()}; shared by the benchmark, the"
        " workers and both servers",
        f"servers   : PostgreSQL {servers.postgres_version()} ({servers.source}), a private"
        f" redis-server {redis_version} on a unix socket (stopped for the Redis-stopped figures)",
        f"processes : {args.workers} worker(s) -c {args.concurrency} and one beat;"
        f" SPACEJOBS_SWEEP_INTERVAL={args.sweep_interval:g} s ({default}),"
        f" SPACEJOBS_TIMER_INTERVAL={args.timer_interval:g} s ({timer_default}), SPACEJOBS_ACTIVE_JOBS_QUOTA"
        f"={os.environ['SPACEJOBS_ACTIVE_JOBS_QUOTA']} (every job of the slots figure is active at"
        " once), every other SPACEJOBS_* setting its default",
        f"sizes     : slots {args.jobs:,} waiting jobs, {args.samples} CPU readings of"
        f" {args.cpu_seconds:g} s per state; timers {args.timers} per figure, spread over"
        f" {args.spread:g} s, first due {args.lead:g} s after the submit, {args.patience:g} s of"
        f" patience; fan-out {args.children:,} children, max_parallel {args.max_parallel},"
        f" {args.reps} pair(s) with a plain drain; chain {args.steps} steps, {args.reps} run(s);"
        f" group two {args.group_seconds:g} s steps after a burst of {args.burst:,} short jobs,"
        f" {args.reps} run(s); cancel after the grandchild ran {args.running_for:g} s,"
        f" {args.reps} run(s)",
        f"load      : {_load()} at start (1 / 5 / 15 min)",
    ]


class Run:
    """The figures of one run, what each target says, and what could not be measured."""

    def __init__(self, args: argparse.Namespace, bench: WaitingBench) -> None:
        self.args = args
        self.bench = bench
        self.lines: list[str] = []
        self.failures: list[str] = []

    def attempt(self, what: str, take: Callable[[], Any]) -> Any:
        try:
            return take()
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as error:
            detail = str(error) if isinstance(error, BenchError) else traceback.format_exc()
            self.failures.append(f"{what}: {detail.strip().splitlines()[0]}")
            say(f"  {what} FAILED: {detail.strip()[-3000:]}")
            return None

    def slots(self) -> None:
        args = self.args
        figure = self.attempt("slots", lambda: self.bench.slots(args.jobs, args.samples, args.cpu_seconds))
        if figure is None:
            self.lines.append("issue 16 slots: not measured")
            return
        _out(f"slots: {figure.jobs:,} jobs waiting {figure.parked_seconds:.1f} s after their submit,"
             f" {figure.stale_wakeups} wake-ups sent meanwhile still queued then, the workers"
             f" quiet {figure.stale_seconds:.1f} s later (the readings start there);"
             f" beat's CPU idle {median(figure.beat_idle):.2f}%, with them waiting"
             f" {median(figure.beat_waiting):.2f}% of a core; a tick of the sweep's chores took"
             f" {1000 * median(figure.sweep_idle):.0f} ms idle, {1000 * median(figure.sweep_waiting):.0f}"
             f" ms with them waiting (medians of {len(figure.sweep_idle)} and"
             f" {len(figure.sweep_waiting)}, beat's log)")
        self.lines += targets.slots_lines(figure)

    def fanout(self) -> None:
        args = self.args
        fans: list[DrainFigure] = []
        plains: list[DrainFigure] = []
        for rep in range(1, args.reps + 1):
            say(f"  fan-out: pair {rep} of {args.reps} (load {_load()})")
            plain = self.attempt("plain drain", lambda: self.bench.plain_drain(args.children))
            fan = self.attempt("fan-out", lambda: self.bench.fan_drain(args.children, args.max_parallel))
            for label, found, into in (("plain drain", plain, plains), ("fan-out", fan, fans)):
                if found is not None:
                    into.append(found)
                    _out(f"{label:<12}: {found.jobs:,} jobs in {found.seconds:.2f} s, {found.rate:,.0f}"
                         f" jobs/s ({found.detail})")
        self.lines.append(targets.fan_out_line(fans, plains, args.max_parallel))

    def chain(self) -> None:
        args = self.args
        chains: list[ChainFigure] = []
        for rep in range(1, args.reps + 1):
            say(f"  chain: run {rep} of {args.reps} (load {_load()})")
            found = self.attempt("chain", lambda: self.bench.chain(args.steps))
            if found is not None:
                chains.append(found)
                _out(f"chain       : {found.steps} steps in {found.seconds:.2f} s from the submit to"
                     f" the completion, the steps' own work {found.work:.2f} s,"
                     f" {1000 * found.overhead_per_step:.1f} ms per step beyond it"
                     f" ({found.runs} runs of the workflow)")
        self.lines.append(targets.chain_line(chains, args.steps))

    def group(self) -> None:
        args = self.args
        groups: list[GroupFigure] = []
        for rep in range(1, args.reps + 1):
            say(f"  group: run {rep} of {args.reps} (load {_load()})")
            found = self.attempt("group", lambda: self.bench.group(args.group_seconds, args.burst))
            if found is not None:
                groups.append(found)
                _out(f"group       : two {found.step_seconds:g} s steps in {found.seconds:.2f} s"
                     f" from the submit to the completion, the steps {found.steps_seconds:.2f} s"
                     f" from the first lease to the last completion, {found.given_back} given"
                     f" back unstarted (after {found.burst:,} short jobs)")
        slots = (f"{args.workers * args.concurrency} free slots ({args.workers} worker(s)"
                 f" -c {args.concurrency})")
        self.lines.append(targets.group_line(groups, args.group_seconds, args.burst, slots))

    def cancel(self) -> None:
        args = self.args
        cancels: list[CancelFigure] = []
        for rep in range(1, args.reps + 1):
            say(f"  cancel: run {rep} of {args.reps} (load {_load()})")
            found = self.attempt("cancel", lambda: self.bench.cancel(args.running_for))
            if found is not None:
                cancels.append(found)
                _out(f"cancel      : the running grandchild cancelled {found.seconds:.2f} s after"
                     f" its workflow's cancel (it had run {found.ran:g} s)")
        self.lines.append(targets.cancel_line(cancels))

    def timers(self) -> None:
        args = self.args
        for redis_running in (True, False):
            for spread in (0.0, args.spread):
                what = (f"timers {'spread' if spread else 'at once'},"
                        f" Redis {'running' if redis_running else 'stopped'}")
                say(f"  {what} (load {_load()})")
                figure = self.attempt(what, lambda s=spread, r=redis_running: self.bench.timers(
                    args.timers, s, lead=args.lead, patience=args.patience, redis_running=r))
                self.lines.append(targets.timer_line(figure, args.sweep_interval, args.timer_interval)
                                  if figure else
                                  f"issue 16 {what}: not measured")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    clean_up_on_signals()
    settings = {"SPACEJOBS_BENCH_KINDS": "1", "SPACEJOBS_EXTRA_KIND_MODULES": KIND_MODULE,
                "SPACEJOBS_SWEEP_INTERVAL": str(args.sweep_interval),
                "SPACEJOBS_TIMER_INTERVAL": str(args.timer_interval),
                # The slots figure's jobs are all active at once, far past the default cap.
                "SPACEJOBS_ACTIVE_JOBS_QUOTA": str(max(args.jobs, args.children) + 1000)}
    os.environ.update(settings)  # the submits of this process, and every process it starts
    reload_settings()
    load_kinds()
    # A short path: redis-server's unix socket lives in it.
    directory = Path(tempfile.mkdtemp(prefix="sj-wait-"))
    try:
        with measured_on(args.embedded) as (admin_url, _their_redis):
            return measure_all(args, admin_url, directory, settings)
    finally:
        if args.keep_logs:
            say(f"logs kept in {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)


def measure_all(args: argparse.Namespace, admin_url: str, directory: Path,
                settings: dict[str, str]) -> int:
    redis = RestartableRedis(directory)
    redis.start()
    servers = Servers(admin_url, redis.url, "embedded" if args.embedded else "DATABASE_URL or the machine's")
    run: Run | None = None
    interrupted = False
    try:
        _out("Jobs that wait without a worker, measured (issue 16); a group side by side and a"
             " tree's cancel (issue 31)")
        for line in header(args, servers, redis):
            _out(line)
        log_dir = directory / "logs"
        log_dir.mkdir()
        stack = Stack(servers, log_dir, label="wait", process_settings=settings)
        try:
            bench = WaitingBench(stack, redis, workers=args.workers, concurrency=args.concurrency)
            run = Run(args, bench)
            _out("")
            try:
                for figure in FIGURES:
                    if figure in args.only:
                        getattr(run, figure)()
            except KeyboardInterrupt:
                interrupted = True
                _out("interrupted: what was measured so far follows")
            finally:
                bench.close()
        finally:
            if redis.popen is None:
                redis.start()  # the stack's queues are removed from it
            stack.stop()
    finally:
        try:
            servers.close()
        finally:
            redis.kill()
    _out("\ntargets (issue 16, \"Measured\"; issue 31, the group and the cancel)")
    for line in run.lines if run else []:
        _out(line)
    _out(f"\nload      : {_load()} at end (1 / 5 / 15 min)")
    for failure in run.failures if run else ["the stack did not start"]:
        _out(f"FAILED: {failure}")
    return 1 if interrupted or run is None or run.failures else 0


if __name__ == "__main__":
    sys.exit(main())
