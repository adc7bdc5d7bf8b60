"""python -m bench.hold: the queue under a long-open transaction, Space Jobs beside PgQueuer
(issue 32).

Each system in turn, on a PostgreSQL 15 server of its own that the benchmark starts on default
settings with autovacuum on (bench.servers ``private_postgres``): a long transaction of one
cannot hold back the other's vacuum, and each starts from a new cluster. Redis is
``REDIS_URL`` (unset: the machine's), which only Space Jobs uses, for its wake-ups. Per system,
for ``--before`` + ``--hold`` + ``--after`` minutes:

- a submitter queues ``--rate`` no-op jobs a second in ten batches a second through the
  system's own API (Space Jobs: ``submit_many`` as space_app over 4 organizations, bench.soak's
  submitter; PgQueuer: ``Queries.enqueue`` of a list over asyncpg), to ``--processes`` worker
  processes (Space Jobs: one worker ``-c P`` and beat, retention of finished jobs 5 minutes as
  in bench.soak; PgQueuer: P ``pgqueuer.run`` processes on its defaults, bench/peers);
- a probe times the system's claim ``--probe-rate`` times a second, one job, in a transaction
  it rolls back (Space Jobs: ``claim_jobs()`` as the worker role, bench.soak's probe; PgQueuer:
  its own ``Queries.dequeue``, the statement its workers run): the claim's cost at that moment,
  timed by the client, not taken from pg_stat_statements (which keeps no percentiles);
- from the end of minute ``--before`` for ``--hold`` minutes, a REPEATABLE READ transaction is
  open and idle after one read, as a BI tool left idle in a transaction.

One line a minute per system: jobs submitted, the claim p50/p95, the end-to-end p50/p95 of the
jobs finished in it (submit to finish, from the system's own rows: Space Jobs' ``created_at``
and ``finished_at``, PgQueuer's ``queued`` and ``successful`` log rows), dead row versions and
the size of every table of its database. Then issue 32's targets (bench/hold_targets.py) for
Space Jobs, PgQueuer's figure beside each. The targets are issue 32's for a 30-minute hold
(the default): a short hold ends inside a hold's first minutes, whose p95 jumps on either
code (four 8-minute runs of two commits, alternating, gave 1.36x to 2.66x on the claim target,
docs/benchmarks.md), so a short run's verdicts are a smoke test, not a measurement.

Exits non-zero only when a figure could not be measured (a worker died, no claim timed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench.harness import percentile
from bench.hold_targets import P95s, around_hold, hold_lines, ms
from bench.peers.base import statements_beside
from bench.servers import MACHINE_REDIS_URL, PRIVATE_MAJOR, private_postgres
from bench.soak import (
    Holder,
    PacedSubmitter,
    Probe,
    Soak,
    Submitter,
    TimedProbe,
    server_settings,
)
from spacejobs.models.db.engine import libpq_url
from spacejobs.models.kinds import load_kinds
from spacejobs.models.settings import reload_settings
from tests.kit.processes import clean_up_on_signals
from tests.kit.servers import Servers
from tests.kit.stack import Stack

SQL = statements_beside(__file__)
#: finished jobs, results and events kept this long (the retention policy), as in bench.soak
KEEP_MINUTES = 5
ORGANIZATIONS = 4


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.hold", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=200, help="jobs submitted per second")
    parser.add_argument("--before", type=int, default=2, help="minutes before the hold")
    parser.add_argument("--hold", type=int, default=30, help="minutes the transaction is open")
    parser.add_argument("--after", type=int, default=3, help="minutes after the hold")
    parser.add_argument("--processes", type=int, default=2,
                        help="worker processes per system (Space Jobs: one worker -c P)")
    parser.add_argument("--probe-rate", type=float, default=5, help="timed claims per second")
    parser.add_argument("--only", choices=("spacejobs", "pgqueuer"), action="append",
                        help="measure only this system (repeatable; default both)")
    parser.add_argument("--minute-seconds", type=float, default=60,
                        help="length of a reported 'minute' (shorter only for a smoke run)")
    args = parser.parse_args(argv)
    if min(args.rate, args.probe_rate, args.minute_seconds) <= 0:
        parser.error("the rates and lengths must be positive")
    if args.before < 1 or args.hold < 1 or args.after < 1 or args.processes < 1:
        parser.error("at least one minute before, during and after the hold, and one process")
    return args


@dataclass
class HoldMinute:
    index: int  # 1-based
    phase: str  # before, HOLD, after
    submitted: int
    claims: list[float]  # seconds, the probe's
    latencies: list[float]  # seconds, submit to finish of the jobs finished in it
    dead: int
    bytes: int

    def p95s(self) -> P95s:
        return P95s(percentile(self.claims, 95) if self.claims else None,
                    percentile(self.latencies, 95) if self.latencies else None)


class Side(ABC):
    """One system on its own server: what it submits with, claims with, holds with and reads."""

    title: str

    def __init__(self) -> None:
        self.reader: psycopg.Connection[Any] | None = None

    @abstractmethod
    def submitter(self, rate: float, stop: threading.Event) -> PacedSubmitter: ...

    @abstractmethod
    def probe(self, rate: float, stop: threading.Event) -> TimedProbe: ...

    @abstractmethod
    def holder(self, opens_at: float, seconds: float, stop: threading.Event) -> Holder: ...

    @abstractmethod
    def check_alive(self) -> None: ...

    finished_between: str  # the name of its hold.sql block

    def read(self, name: str, **params: Any) -> list[tuple[Any, ...]]:
        assert self.reader is not None
        return self.reader.execute(SQL[name], params).fetchall()

    def latencies(self, since: datetime, until: datetime) -> list[float]:
        return [float(r[0]) for r in self.read(self.finished_between, since=since, until=until)]

    def now(self) -> datetime:
        moment: datetime = self.read("now")[0][0]
        return moment


class SpaceJobsSide(Side):
    """Space Jobs on bench.soak's set-up: a stack of the test kit, one worker -c P and beat."""

    title = "Space Jobs"
    finished_between = "spacejobs_finished_between"

    def __init__(self, servers: Servers, logs: Path, processes: int) -> None:
        super().__init__()
        self.stack = Stack(servers, logs, label="hold", process_settings={"SPACEJOBS_BENCH_KINDS": "1"})
        days = KEEP_MINUTES / (24 * 60)
        self.stack.set_retention(jobs_days=days, results_days=days, events_days=days)
        self.soak = Soak(self.stack, argparse.Namespace(
            organizations=ORGANIZATIONS, workers=1, concurrency=processes, sweep_interval=None))
        self.reader = psycopg.connect(libpq_url(self.stack.admin_url), autocommit=True)

    def submitter(self, rate: float, stop: threading.Event) -> PacedSubmitter:
        return Submitter(self.soak.jobs, self.stack.app_db, self.soak.tenants, rate, stop)

    def probe(self, rate: float, stop: threading.Event) -> TimedProbe:
        return Probe(self.stack.worker_url, rate, stop)

    def holder(self, opens_at: float, seconds: float, stop: threading.Event) -> Holder:
        return Holder(self.stack.operator_url, opens_at, seconds, stop)

    def check_alive(self) -> None:
        self.stack.processes.check_alive()

    def close(self) -> None:
        try:
            if self.reader is not None:
                self.reader.close()
            self.soak.stats_db.dispose()
            self.soak.jobs.close()
        finally:
            self.stack.stop()


class PgQueuerSubmitter(PacedSubmitter):
    """PgQueuer's batches: ``Queries.enqueue`` of a list, over an asyncpg connection of its own
    on uvloop, as the peer's producer."""

    def __init__(self, url: str, rate: float, stop: threading.Event) -> None:
        super().__init__(rate, stop, name="hold-pgqueuer-submitter")
        self.url = url
        self.call: Callable[[int], None] | None = None

    @contextlib.contextmanager
    def opened(self) -> Iterator[object]:
        from bench.peers.pgqueuer import ENTRYPOINT, open_queries

        with open_queries(self.url) as (runner, _, queries):
            def enqueue(count: int) -> None:
                runner.run(queries.enqueue([ENTRYPOINT] * count, [None] * count, [0] * count))

            self.call = enqueue
            yield None

    def submit(self, count: int, tick: int) -> None:
        assert self.call is not None
        self.call(count)


class PgQueuerProbe(TimedProbe):
    """PgQueuer's claim, ``Queries.dequeue`` of one job as its workers call it (its entrypoint,
    no concurrency limit, the supervisor's 30 s heartbeat timeout), in a transaction rolled back."""

    def __init__(self, url: str, rate: float, stop: threading.Event) -> None:
        super().__init__(rate, stop, name="hold-pgqueuer-probe")
        self.url = url

    @contextlib.contextmanager
    def claimer(self) -> Iterator[Callable[[], None]]:
        from pgqueuer.ports.repository import EntrypointExecutionParameter
        from pgqueuer.types import QueueEntrypoint, QueueManagerId

        from bench.peers.pgqueuer import ENTRYPOINT, open_queries

        entrypoints = {QueueEntrypoint(ENTRYPOINT): EntrypointExecutionParameter(concurrency_limit=0)}
        manager = QueueManagerId(uuid.uuid4())
        with open_queries(self.url) as (runner, connection, queries):
            async def claim_once() -> None:
                transaction = connection.transaction()
                await transaction.start()
                try:
                    await queries.dequeue(batch_size=1, entrypoints=entrypoints,
                                          queue_manager_id=manager, global_concurrency_limit=None,
                                          heartbeat_timeout=timedelta(seconds=30))
                finally:
                    await transaction.rollback()

            yield lambda: runner.run(claim_once())


class PgQueuerSide(Side):
    """PgQueuer on its defaults through its peer driver (bench/peers/pgqueuer.py)."""

    finished_between = "pgqueuer_finished_between"

    def __init__(self, admin_url: str, processes: int) -> None:
        super().__init__()
        from bench.peers.pgqueuer import PgQueuerPeer

        self.peer = PgQueuerPeer().prepare(admin_url, "", f"hold_{uuid.uuid4().hex[:6]}")
        self.title = self.peer.title
        assert self.peer.db is not None
        self.url = self.peer.db.url
        self.reader = psycopg.connect(self.url, autocommit=True)
        # The minute's latencies join pgqueuer_log to itself; before autovacuum first analyzes
        # the log, the planner may pick a nested loop over it, quadratic in the log's rows: the
        # likely cause of a read that once lasted about 25 s (by the count it skewed) at the end
        # of a measured minute. A hash join reads a minute's rows in a fraction of a second.
        self.reader.execute(SQL["reader_session"])
        self.peer.start_workers(processes, *self.peer._worker_argv())
        self.peer.wait_until(f"{processes} workers ready",
                             lambda: self.peer.scalar("workers_ready") >= processes, timeout=120)

    def submitter(self, rate: float, stop: threading.Event) -> PacedSubmitter:
        return PgQueuerSubmitter(self.url, rate, stop)

    def probe(self, rate: float, stop: threading.Event) -> TimedProbe:
        return PgQueuerProbe(self.url, rate, stop)

    def holder(self, opens_at: float, seconds: float, stop: threading.Event) -> Holder:
        return Holder(self.url, opens_at, seconds, stop, read=SQL["pgqueuer_report_read"])

    def check_alive(self) -> None:
        self.peer.workers.check_alive()

    def close(self) -> None:
        try:
            if self.reader is not None:
                self.reader.close()
        finally:
            self.peer.cleanup()


def run(side: Side, args: argparse.Namespace) -> list[HoldMinute]:
    """The run's minutes for one system, each printed as it ends."""
    span = args.minute_seconds
    stop = threading.Event()
    start = time.monotonic()
    probe = side.probe(args.probe_rate, stop)
    submitter = side.submitter(args.rate, stop)
    holder = side.holder(start + args.before * span, args.hold * span, stop)
    phases = ["before"] * args.before + ["HOLD"] * args.hold + ["after"] * args.after
    minutes: list[HoldMinute] = []
    since = side.now()
    for thread in (probe, submitter, holder):
        thread.start()
    submitted_before = 0
    try:
        for index, phase in enumerate(phases, start=1):
            minute_start, minute_end = start + (index - 1) * span, start + index * span
            while time.monotonic() < minute_end:
                side.check_alive()
                if submitter.error is not None:
                    raise RuntimeError(f"the submitter stopped: {submitter.error!r}")
                time.sleep(min(2.0, max(0.0, minute_end - time.monotonic())))
            until, submitted = side.now(), submitter.submitted  # the reads below take time
            dead, size = side.read("tables")[0]
            minute = HoldMinute(index, phase, submitted - submitted_before,
                                probe.between(minute_start, minute_end),
                                side.latencies(since, until), int(dead), int(size))
            minutes.append(minute)
            print(row(side.title, minute), flush=True)
            since, submitted_before = until, submitted
    finally:
        stop.set()
        for thread in (probe, submitter, holder):
            thread.join(timeout=30)
    if probe.errors:
        say(f"{side.title} probe: {probe.errors} claims failed")
    if holder.opened is None:
        raise RuntimeError("the reporting transaction never opened")
    return minutes


HEADER = ("system              min  phase   submitted  claim p50/p95 ms  e2e p50/p95 ms"
          "  finished  dead rows  tables MB")


def row(system: str, m: HoldMinute) -> str:
    claim50 = percentile(m.claims, 50) if m.claims else None
    e2e50 = percentile(m.latencies, 50) if m.latencies else None
    p95 = m.p95s()
    return (f"{system[:18]:<18}  {m.index:>3}  {m.phase:<6}  {m.submitted:>9,}"
            f"  {ms(claim50):>7} / {ms(p95.claim):>7}  {ms(e2e50):>6} / {ms(p95.e2e):>6}"
            f"  {len(m.latencies):>8,}  {m.dead:>9,}  {m.bytes / 2**20:>9.1f}")


def measure(name: str, args: argparse.Namespace, redis_url: str,
            directory: Path) -> tuple[str, list[HoldMinute]]:
    """One system's run on a new private server: its title and minutes."""
    with private_postgres() as admin_url:
        servers = Servers(admin_url, redis_url, f"private PostgreSQL {PRIVATE_MAJOR}")
        side: SpaceJobsSide | PgQueuerSide | None = None
        try:
            say(f"{name}: PostgreSQL {servers.postgres_version()} started at {admin_url}; "
                + ", ".join(f"{k} {v}" for k, v in server_settings(admin_url).items()))
            logs = directory / name
            logs.mkdir()
            side = SpaceJobsSide(servers, logs, args.processes) if name == "spacejobs" else \
                PgQueuerSide(admin_url, args.processes)
            return side.title, run(side, args)
        finally:
            if side is not None:
                side.close()
            servers.close()


def pgqueuer_missing() -> str | None:
    try:
        import pgqueuer  # noqa: F401
    except ImportError:
        return "PgQueuer is not installed (pip install -e '.[bench]')"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    clean_up_on_signals()
    os.environ["SPACEJOBS_BENCH_KINDS"] = "1"
    reload_settings()
    load_kinds()
    redis_url = os.environ.get("REDIS_URL", MACHINE_REDIS_URL)
    wanted = args.only or ["spacejobs", "pgqueuer"]
    missing = pgqueuer_missing() if "pgqueuer" in wanted else None
    print("The queue under a long-open transaction, Space Jobs beside PgQueuer (issue 32)", flush=True)
    print(f"command   : python -m bench.hold {' '.join(argv if argv is not None else sys.argv[1:])}",
          flush=True)
    print(f"servers   : a new PostgreSQL {PRIVATE_MAJOR} per system, default settings (autovacuum"
          f" on), one after the other; Redis {redis_url.split('@')[-1]} (Space Jobs' wake-ups);"
          f" {os.cpu_count()} CPUs shared with both servers; load {os.getloadavg()[0]:.2f}",
          flush=True)
    print(f"load      : {args.rate:g} no-op jobs/s in 10 batches/s, {args.before} + {args.hold}"
          f" + {args.after} minutes of {args.minute_seconds:g} s, {args.processes} worker"
          " processes per system", flush=True)
    print("hold      : REPEATABLE READ, one read, then idle in transaction through the HOLD minutes",
          flush=True)
    print(f"claim     : timed by a probe {args.probe_rate:g}/s, one job, rolled back: Space Jobs'"
          " claim_jobs() as the worker role, PgQueuer's Queries.dequeue", flush=True)
    print("e2e       : submit -> finish of the jobs finished in the minute, from each system's rows",
          flush=True)
    if missing:
        print(f"PgQueuer  : not measured: {missing}", flush=True)
        wanted = [name for name in wanted if name != "pgqueuer"]
    print("", flush=True)
    print(HEADER, flush=True)
    directory = Path(tempfile.mkdtemp(prefix="sj-hold-"))
    results: dict[str, tuple[str, list[HoldMinute]]] = {}
    failures = []
    try:
        for name in wanted:
            try:
                results[name] = measure(name, args, redis_url, directory)
            except Exception as error:
                failures.append(f"{name}: {error}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"\nload at the end {os.getloadavg()[0]:.2f}")
    hold_first, hold_last = args.before + 1, args.before + args.hold

    def around(name: str) -> tuple[str, Any] | None:
        if name not in results:
            return None
        title, minutes = results[name]
        return title, around_hold([m.p95s() for m in minutes], hold_first, hold_last)

    ours, peer = around("spacejobs"), around("pgqueuer")
    if ours is not None:
        for line in hold_lines("Space Jobs", ours[1], peer):
            print(line)
    elif peer is not None:
        for line in hold_lines(peer[0], peer[1]):
            print(line)
    for failure in failures:
        print(f"FAILED: {failure}")
    unmeasured = not results or any(not any(m.claims for m in minutes)
                                    for _, minutes in results.values())
    return 1 if failures or unmeasured else 0


if __name__ == "__main__":
    sys.exit(main())
