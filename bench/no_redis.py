"""python -m bench.no_redis: the drain and the latency with Redis running and with Redis
stopped, in one run (issue 17, part 1).

One stack (tests/kit) on the machine's PostgreSQL (``DATABASE_URL``, or ``--embedded``) and a
private redis-server on a unix socket that the run stops and starts again. The same workers and
beat serve both phases; with Redis stopped, their pool processes claim from PostgreSQL alone
(tasks/floor.py). Each phase gives its jobs an organization of its own and reads the figures
from the rows and events (bench/rows.py), never from the workers:

- drain: N ``bench.noop`` jobs submitted in batches (one transaction per 1,000), from the first
  submit to the last finish;
- latency: ``bench.noop`` jobs submitted one at a time at a steady rate, submit to finish
  (``created_at`` to ``finished_at``), p50 / p95 / p99.

Every job must complete once in one attempt (the invariant line of each phase); the run exits
non-zero when one does not, or a phase could not be measured. Issue 17 asks for the figures,
not a target: the report prints them side by side, with the ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench import rows
from bench.harness import paced, percentile, poll
from bench.servers import add_embedded_option, measured_on
from spacejobs.models.jobs.service import JobRequest, Jobs
from spacejobs.models.kinds import load_kinds
from spacejobs.models.settings import Settings, reload_settings
from spacejobs.tasks.wakeups import WakeupPublisher
from tests.kit.private_servers import RestartableRedis
from tests.kit.processes import clean_up_on_signals
from tests.kit.servers import Servers
from tests.kit.stack import Stack

BATCH = 1000
#: seconds after Redis stops before the phase starts: past the linger of the last drain, so the
#: phase measures the floor, not a pool process that happened to be listening already
QUIET = Settings.model_fields["linger_seconds"].default + 2.0


@dataclass(frozen=True)
class Phase:
    redis: str  # "running" / "stopped"
    drain_jobs: int
    drain_seconds: float
    latencies: list[float]  # seconds, submit to finish
    invariants: list[str]  # one line per part, "ok ..." or "FAIL ..."

    @property
    def drain_rate(self) -> float:
        return self.drain_jobs / self.drain_seconds


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.no_redis", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2000, help="jobs of each drain")
    parser.add_argument("--latency-jobs", type=int, default=300, help="paced jobs of each latency figure")
    parser.add_argument("--rate", type=float, default=20.0, help="paced submits per second")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for a phase's jobs")
    parser.add_argument("--quick", action="store_true", help="smoke run: 200 jobs, 40 paced")
    add_embedded_option(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs, args.latency_jobs = min(args.jobs, 200), min(args.latency_jobs, 40)
    if min(args.jobs, args.latency_jobs, args.workers, args.concurrency) < 1 or args.rate <= 0:
        parser.error("the sizes and the rate must be positive")
    return args


class Bench:
    def __init__(self, stack: Stack, redis: RestartableRedis, args: argparse.Namespace) -> None:
        self.stack = stack
        self.redis = redis
        self.args = args
        # The producer publishes like the web: to the private Redis, skipping it while it is down.
        self.jobs = Jobs(stack.app_db, wake=WakeupPublisher(redis.url, stack.queue).wake)
        self.workers = [stack.start_worker(args.concurrency)
                        for _ in range(args.workers)]
        self.beat = stack.start_beat()

    def phase(self, redis: str) -> Phase:
        lines: list[str] = []
        drain_org = self.stack.tenant(f"drain-{uuid.uuid4().hex[:6]}")
        started = time.perf_counter()
        for first in range(0, self.args.jobs, BATCH):
            with self.stack.app_db.begin() as conn:
                self.jobs.submit_many(conn, [JobRequest("bench.noop")] * min(BATCH, self.args.jobs - first),
                                      organization_id=drain_org.organization_id,
                                      requested_by=drain_org.user_id)
        self.finish(drain_org.organization_id, self.args.jobs, f"drain, Redis {redis}")
        drain_seconds = time.perf_counter() - started
        lines.append(self.invariant(drain_org.organization_id, self.args.jobs, f"drain, Redis {redis}"))

        paced_org = self.stack.tenant(f"paced-{uuid.uuid4().hex[:6]}")

        def submit_one() -> None:
            with self.stack.app_db.begin() as conn:
                self.jobs.submit(conn, "bench.noop", organization_id=paced_org.organization_id,
                                 requested_by=paced_org.user_id)

        paced(self.args.rate, self.args.latency_jobs, submit_one)
        self.finish(paced_org.organization_id, self.args.latency_jobs, f"latency, Redis {redis}")
        lines.append(self.invariant(paced_org.organization_id, self.args.latency_jobs,
                                    f"latency, Redis {redis}"))
        with self.stack.admin() as conn:
            latencies = rows.row_latencies(conn, paced_org.organization_id)
        return Phase(redis, self.args.jobs, drain_seconds, latencies, lines)

    def finish(self, org: uuid.UUID, count: int, what: str) -> None:
        def done() -> bool:
            with self.stack.admin() as conn:
                return rows.finished_count(conn, org) >= count

        if not poll(done, self.args.timeout, interval=0.05, between=self.stack.processes.check_alive):
            raise RuntimeError(f"{what}: not every job finished within {self.args.timeout:g} s")

    def invariant(self, org: uuid.UUID, count: int, what: str) -> str:
        with self.stack.admin() as conn:
            ok, words = rows.outcome(conn, org).invariants(count)
        return f"{'ok' if ok else 'FAIL'} {what}: {words}"


def report(phases: list[Phase]) -> list[str]:
    out = []
    for phase in phases:
        values = phase.latencies
        out.append(f"Redis {phase.redis:<8}: drain {phase.drain_jobs:,} jobs in {phase.drain_seconds:.2f} s,"
                   f" {phase.drain_rate:,.0f} jobs/s; latency submit > finish p50"
                   f" {1000 * percentile(values, 50):.1f} ms, p95 {1000 * percentile(values, 95):.1f} ms,"
                   f" p99 {1000 * percentile(values, 99):.1f} ms ({len(values)} jobs)")
    if len(phases) == 2:
        up, down = phases
        out.append(f"Redis stopped against running: drain {down.drain_rate / up.drain_rate:.2f}x,"
                   f" latency p50 {percentile(down.latencies, 50) / percentile(up.latencies, 50):.2f}x,"
                   f" p95 {percentile(down.latencies, 95) / percentile(up.latencies, 95):.2f}x")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    clean_up_on_signals()
    settings = {"SPACEJOBS_BENCH_KINDS": "1"}
    os.environ.update(settings)
    reload_settings()
    load_kinds()
    directory = Path(tempfile.mkdtemp(prefix="sj-nored-"))  # short: the Redis socket lives here
    phases: list[Phase] = []
    failures: list[str] = []
    try:
        with measured_on(args.embedded) as (admin_url, _their_redis):
            redis = RestartableRedis(directory)
            redis.start()
            servers = Servers(admin_url, redis.url, "embedded" if args.embedded else "DATABASE_URL")
            print("Jobs with Redis running and stopped, measured (issue 17, part 1)", flush=True)
            print(f"servers   : PostgreSQL {servers.postgres_version()}, a private redis-server on a"
                  " unix socket, stopped for the second phase", flush=True)
            print(f"processes : {args.workers} worker(s) -c {args.concurrency} and beat, every"
                  f" SPACEJOBS_* setting its default; {os.cpu_count()} CPUs shared with both servers",
                  flush=True)
            print(f"sizes     : drain {args.jobs:,} bench.noop; latency {args.latency_jobs} bench.noop"
                  f" paced at {args.rate:g}/s", flush=True)
            (directory / "logs").mkdir()
            stack = Stack(servers, directory / "logs", label="nored", process_settings=settings)
            try:
                bench = Bench(stack, redis, args)
                for state in ("running", "stopped"):
                    if state == "stopped":
                        redis.kill()
                        time.sleep(QUIET)  # a hold: past the last drain's linger
                    say(f"phase: Redis {state}")
                    try:
                        phases.append(bench.phase(state))
                    except Exception as error:
                        failures.append(f"Redis {state}: {error}")
            finally:
                if redis.popen is None:
                    redis.start()
                stack.stop()
                servers.close()
                redis.kill()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print("")
    for line in report(phases):
        print(line)
    for phase in phases:
        for line in phase.invariants:
            print(line)
            if line.startswith("FAIL"):
                failures.append(line)
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures or len(phases) < 2 else 0


if __name__ == "__main__":
    sys.exit(main())
