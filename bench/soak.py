"""python -m bench.soak: a steady load for half an hour, with a reporting transaction held open
for ten minutes in the middle of it (issue 17, part 4).

One stack (tests/kit) on the machine's PostgreSQL (``DATABASE_URL``, or ``--embedded``, or
``--private``: a new PostgreSQL 15 on its default settings, as bench.hold's) and Redis,
workers and beat on the product's settings, the database's retention policy set to
``--keep-minutes`` so that finished jobs and their events are purged by the sweeper as in
production and a steady load reaches a steady size. Then, for ``--minutes``:

- a submitter queues ``--rate`` ``bench.noop`` jobs a second, in ten batches a second spread
  over ``--organizations`` organizations, which the workers claim and finish;
- a probe times the claim the workers run (``claim_jobs()``, one job) ``--probe-rate`` times a
  second, each in a transaction it rolls back: the claim's own cost at that moment;
- from minute ``--hold-at`` for ``--hold-minutes``, a reporting connection holds a REPEATABLE
  READ transaction open after one read, as a BI tool left idle in a transaction does: while it
  is open no vacuum may remove a row version it could still see.

Each minute prints one line: the claim's p50 / p95, the end-to-end latency (submit to finish,
from the rows) p50 / p95, the deepest queue seen, the dead tuples and total size of ``jobs``
and ``job_events``, the autovacuum runs in the minute and the share of updates that were HOT.
The claim's plan (``EXPLAIN (ANALYZE, BUFFERS)`` through auto_explain) is read before the hold,
at the end of it and at the end of the run. Then the targets, each PASS or FALL SHORT:

- the claim p95 of the last minute at most 1.5x that of the first;
- recovery: within 2 minutes after the hold ends, the claim p95 and the end-to-end p95 are
  back to at most 1.5x the pre-hold level (the median of the minutes before the hold, the
  first minute left out when there are others) and stay there to the end;
- issue 32's (bench/hold_targets.py, judged as bench.hold judges them): in the hold's last
  minute the claim p95 and the end-to-end p95 at most 1.5x the minute before the hold, in the
  first minute after it at most 1.2x, and the size of jobs + job_events at the end at most
  1.5x the minute before the hold. Issue 32's soak is an hour with half an hour's hold in the
  middle: ``--private --minutes 60 --hold-at 15 --hold-minutes 30``.

Exits non-zero only when a figure could not be measured (a worker died, no claim timed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import psycopg
from sqlalchemy import Engine

from bench.harness import percentile
from bench.hold_targets import P95s, around_hold, hold_lines, size_line
from bench.servers import (
    MACHINE_REDIS_URL,
    PRIVATE_MAJOR,
    add_embedded_option,
    measured_on,
    private_postgres,
)
from spacejobs.models.db.engine import libpq_url, make_engine
from spacejobs.models.db.queries import queries_beside
from spacejobs.models.jobs.service import JobRequest, Jobs
from spacejobs.models.kinds import load_kinds
from spacejobs.models.settings import reload_settings
from spacejobs.tasks.wakeups import WakeupPublisher
from tests.kit.processes import clean_up_on_signals
from tests.kit.seeding import Tenant
from tests.kit.servers import Servers
from tests.kit.stack import Stack

Q = queries_beside(__file__)

TICKS_PER_SECOND = 10
#: the targets: last minute's claim p95 against the first's, and the level recovery returns to
TARGET_RATIO = 1.5
RECOVERY_MINUTES = 2
TABLES = ("jobs", "job_events")


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30, help="length of the run")
    parser.add_argument("--hold-at", type=float, default=10,
                        help="minute at which the reporting transaction opens")
    parser.add_argument("--hold-minutes", type=float, default=10,
                        help="how long it stays open (0: no hold)")
    parser.add_argument("--rate", type=float, default=200, help="jobs submitted per second")
    parser.add_argument("--organizations", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--probe-rate", type=float, default=5, help="timed claims per second")
    parser.add_argument("--keep-minutes", type=float, default=5,
                        help="the retention policy of finished jobs, results and events")
    parser.add_argument("--sweep-interval", type=float, default=None,
                        help="SPACEJOBS_SWEEP_INTERVAL of beat (default: the product's)")
    parser.add_argument("--minute-seconds", type=float, default=60,
                        help="length of a reported 'minute' (shorter only for a smoke run)")
    add_embedded_option(parser)
    parser.add_argument("--private", action="store_true",
                        help=f"measure on a new PostgreSQL {PRIVATE_MAJOR} on its default settings"
                             " (autovacuum on), started for this run, as bench.hold does;"
                             " Redis: REDIS_URL, else the machine's")
    args = parser.parse_args(argv)
    if args.private and args.embedded:
        parser.error("--private or --embedded, not both")
    if min(args.minutes, args.rate, args.probe_rate, args.keep_minutes, args.minute_seconds) <= 0:
        parser.error("the lengths and rates must be positive")
    if min(args.organizations, args.workers, args.concurrency) < 1:
        parser.error("at least one organization, worker and process")
    if args.hold_minutes < 0 or args.hold_at < 0:
        parser.error("the hold cannot start or last less than nothing")
    return args


@dataclass
class TableStats:
    dead: int
    bytes: int
    autovacuums: int
    updates: int
    hot_updates: int


@dataclass
class Minute:
    index: int  # 1-based
    holding: bool  # the reporting transaction was open during some of it
    submitted: int
    claims: list[float]  # seconds, the probe's
    latencies: list[float]  # seconds, submit to finish of the jobs finished in it
    queued_max: int
    tables: dict[str, TableStats]
    autovacuums: dict[str, int]  # in this minute
    hot_share: dict[str, float | None]  # HOT updates / updates in this minute

    def claim_p(self, p: float) -> float | None:
        return percentile(self.claims, p) if self.claims else None

    def latency_p(self, p: float) -> float | None:
        return percentile(self.latencies, p) if self.latencies else None


@dataclass
class Plan:
    when: str
    notices: list[str] = field(default_factory=list)  # one statement's plan each

    def summary(self) -> str:
        """The claim's statement (the UPDATE of claim_jobs()): its duration and its top node's
        buffers. (The call around it is left out: on the fresh connection a plan is read on,
        it also pays for loading the catalog.)"""
        notice = next((n for n in self.notices if "WITH open_orgs" in n), "")
        duration = re.search(r"duration: ([\d.]+ ms)", notice)
        buffers = re.search(r"Buffers: ([^\n]+)", notice)
        return (f"{self.when}: claim statement {duration.group(1) if duration else '?'}"
                f" ({buffers.group(1).strip() if buffers else '?'})")


class TimedProbe(threading.Thread):
    """Times one claim ``rate`` times a second; a subclass says how it connects and claims
    (``claimer``: a context giving the function that claims once and changes nothing)."""

    def __init__(self, rate: float, stop: threading.Event, name: str = "soak-probe") -> None:
        super().__init__(name=name, daemon=True)
        self.rate = rate
        self.stop = stop
        self.samples: list[tuple[float, float]] = []  # (monotonic at the start, seconds)
        self.errors = 0

    def claimer(self) -> contextlib.AbstractContextManager[Callable[[], None]]:
        raise NotImplementedError

    def run(self) -> None:
        with self.claimer() as claim:
            next_at = time.monotonic()
            while not self.stop.is_set():
                next_at += 1 / self.rate
                started = time.monotonic()
                try:
                    claim()
                    self.samples.append((started, time.monotonic() - started))
                except Exception:  # counted and reported; the next claim is timed as usual
                    self.errors += 1
                self.stop.wait(max(0.0, next_at - time.monotonic()))

    def between(self, start: float, end: float) -> list[float]:
        return [s for at, s in list(self.samples) if start <= at < end]


class Probe(TimedProbe):
    """Times the workers' claim, one job, in a rolled-back transaction, ``rate`` times a second."""

    def __init__(self, worker_url: str, rate: float, stop: threading.Event) -> None:
        super().__init__(rate, stop)
        self.url = libpq_url(worker_url)
        self.sql = str(Q["probe_claim"])

    @contextlib.contextmanager
    def claimer(self) -> Iterator[Callable[[], None]]:
        with psycopg.connect(self.url, application_name="spacejobs-soak-probe") as conn:
            def claim() -> None:
                with conn.transaction(force_rollback=True):
                    conn.execute(self.sql).fetchone()

            yield claim


class PacedSubmitter(threading.Thread):
    """``rate`` jobs a second in ten batches a second; a subclass says how a batch is submitted
    (``submit``), and may open what it needs around the run (``opened``)."""

    def __init__(self, rate: float, stop: threading.Event, name: str = "soak-submitter") -> None:
        super().__init__(name=name, daemon=True)
        self.rate = rate
        self.stop = stop
        self.submitted = 0
        self.error: BaseException | None = None

    def submit(self, count: int, tick: int) -> None:
        raise NotImplementedError

    def opened(self) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext()

    def run(self) -> None:
        try:
            with self.opened():
                start = time.monotonic()
                tick = 0
                while not self.stop.is_set():
                    tick += 1
                    due = int(self.rate * tick / TICKS_PER_SECOND) - self.submitted
                    if due > 0:
                        self.submit(due, tick)
                        self.submitted += due
                    # a late tick is made up by the next batch, never skipped
                    self.stop.wait(max(0.0, start + tick / TICKS_PER_SECOND - time.monotonic()))
        except BaseException as error:  # reported by the main thread, which ends the run
            self.error = error


class Submitter(PacedSubmitter):
    """Space Jobs' batches: ``submit_many`` as space_app, each batch to the next organization."""

    def __init__(self, jobs: Jobs, app_db: Engine, tenants: list[Tenant], rate: float,
                 stop: threading.Event) -> None:
        super().__init__(rate, stop)
        self.jobs, self.app_db, self.tenants = jobs, app_db, tenants

    def submit(self, count: int, tick: int) -> None:
        tenant = self.tenants[tick % len(self.tenants)]
        with self.app_db.begin() as conn:
            self.jobs.submit_many(conn, [JobRequest("bench.noop")] * count,
                                  organization_id=tenant.organization_id,
                                  requested_by=tenant.user_id)


class Holder(threading.Thread):
    """The reporting transaction: REPEATABLE READ, one read, then idle until it ends."""

    def __init__(self, url: str, opens_at: float, seconds: float, stop: threading.Event,
                 read: str | None = None) -> None:
        super().__init__(name="soak-holder", daemon=True)
        self.url = libpq_url(url)
        self.read = read or str(Q["report_read"])
        self.opens_at, self.seconds = opens_at, seconds
        self.stop = stop
        self.opened: float | None = None
        self.closed: float | None = None

    def run(self) -> None:
        if self.seconds <= 0 or self.stop.wait(max(0.0, self.opens_at - time.monotonic())):
            return
        with psycopg.connect(self.url, application_name="spacejobs-soak-report") as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            with conn.transaction():
                conn.execute(self.read).fetchall()
                self.opened = time.monotonic()
                say("hold: the reporting transaction is open")
                self.stop.wait(self.seconds)
            self.closed = time.monotonic()
            say("hold: the reporting transaction has ended")


#: the server settings a soak's figures depend on, printed in the header
VACUUM_SETTINGS = ("autovacuum", "autovacuum_naptime", "autovacuum_vacuum_scale_factor",
                   "autovacuum_vacuum_insert_scale_factor", "autovacuum_vacuum_cost_limit",
                   "autovacuum_vacuum_cost_delay", "autovacuum_max_workers", "shared_buffers")


def server_settings(admin_url: str) -> dict[str, str]:
    with psycopg.connect(libpq_url(admin_url)) as conn:
        return {name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
                for name in VACUUM_SETTINGS}


def claim_plan(admin_url: str, when: str) -> Plan:
    """The claim's plan with its buffers, as auto_explain reports the statement inside
    claim_jobs() (an EXPLAIN of the call shows only the call), in a rolled-back transaction."""
    plan = Plan(when)
    with psycopg.connect(libpq_url(admin_url)) as conn:
        conn.add_notice_handler(lambda notice: plan.notices.append(notice.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        for setting, value in (("log_min_duration", "0"), ("log_analyze", "on"),
                               ("log_buffers", "on"), ("log_nested_statements", "on"),
                               ("log_level", "notice")):
            conn.execute(f"SET auto_explain.{setting} = {value}")
        with conn.transaction(force_rollback=True):
            conn.execute(str(Q["probe_claim"])).fetchone()
    return plan


class Soak:
    def __init__(self, stack: Stack, args: argparse.Namespace) -> None:
        self.stack, self.args = stack, args
        self.stop = threading.Event()
        self.tenants = [stack.tenant(f"soak-{n}-{uuid.uuid4().hex[:6]}")
                        for n in range(args.organizations)]
        self.jobs = Jobs(stack.app_db, wake=WakeupPublisher(stack.redis_url, stack.queue).wake)
        extra = {} if args.sweep_interval is None else {
            "SPACEJOBS_SWEEP_INTERVAL": str(args.sweep_interval)}
        for _ in range(args.workers):
            stack.start_worker(args.concurrency)
        stack.start_beat(**extra)
        self.stats_db = make_engine(stack.admin_url, pool_size=1,
                                    application_name="spacejobs-soak-stats")
        self.plans: list[Plan] = []

    def run(self) -> list[Minute]:
        args = self.args
        span = args.minute_seconds
        count = max(1, round(args.minutes))
        start = time.monotonic()
        hold_from = start + args.hold_at * span
        hold_to = hold_from + args.hold_minutes * span
        probe = Probe(self.stack.worker_url, args.probe_rate, self.stop)
        submitter = Submitter(self.jobs, self.stack.app_db, self.tenants, args.rate, self.stop)
        holder = Holder(self.stack.operator_url, hold_from, args.hold_minutes * span, self.stop)
        plan_minutes = {max(1, round(args.hold_at)): "before the hold",
                        round(args.hold_at + args.hold_minutes): "at the hold's end",
                        count: "at the end of the run"} if args.hold_minutes > 0 else {
                            count: "at the end of the run"}
        minutes: list[Minute] = []
        before = self.tables()
        since = self.db_now()
        for thread in (probe, submitter, holder):
            thread.start()
        submitted_before = 0
        try:
            for index in range(1, count + 1):
                minute_start, minute_end = start + (index - 1) * span, start + index * span
                queued_max = 0
                while time.monotonic() < minute_end:
                    queued_max = max(queued_max, self.queued())
                    self.stack.processes.check_alive()
                    if submitter.error is not None:
                        raise RuntimeError(f"the submitter stopped: {submitter.error!r}")
                    if (index in plan_minutes and time.monotonic() > minute_end - 10
                            and not any(p.when == plan_minutes[index] for p in self.plans)):
                        self.plans.append(claim_plan(self.stack.admin_url, plan_minutes[index]))
                    time.sleep(min(2.0, max(0.0, minute_end - time.monotonic())))
                until = self.db_now()
                after = self.tables()
                with self.stats_db.connect() as conn:
                    latencies = [r[0] for r in conn.execute(Q["finished_between"],
                                                            {"since": since, "until": until})]
                holding = args.hold_minutes > 0 and minute_start < hold_to and minute_end > hold_from
                minute = Minute(
                    index, holding, submitter.submitted - submitted_before,
                    probe.between(minute_start, minute_end), latencies, queued_max, after,
                    {t: after[t].autovacuums - before[t].autovacuums for t in TABLES},
                    {t: hot_share(before[t], after[t]) for t in TABLES})
                minutes.append(minute)
                print(row(minute), flush=True)
                before, since, submitted_before = after, until, submitter.submitted
        finally:
            self.stop.set()
            for thread in (probe, submitter, holder):
                thread.join(timeout=30)
            self.stats_db.dispose()
            self.jobs.close()
        if probe.errors:
            say(f"probe: {probe.errors} claims failed")
        return minutes

    def tables(self) -> dict[str, TableStats]:
        with self.stats_db.connect() as conn:
            return {r.name: TableStats(r.dead, r.bytes, r.autovacuums, r.updates, r.hot_updates)
                    for r in conn.execute(Q["tables"])}

    def queued(self) -> int:
        with self.stats_db.connect() as conn:
            depth: int = conn.execute(Q["queued"]).scalar_one()
            return depth

    def db_now(self) -> datetime:
        with self.stats_db.connect() as conn:
            moment: datetime = conn.execute(Q["now"]).scalar_one()
            return moment


def hot_share(before: TableStats, after: TableStats) -> float | None:
    updates = after.updates - before.updates
    return (after.hot_updates - before.hot_updates) / updates if updates > 0 else None


# -- the report ---------------------------------------------------------------------------------

HEADER = ("min  hold  submitted  claim p50/p95 ms  e2e p50/p95 ms  queued max"
          "  jobs dead / MB  av  HOT   events dead / MB  av  HOT")


def ms(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.1f}"


def share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def row(m: Minute) -> str:
    jobs, events = m.tables["jobs"], m.tables["job_events"]
    return (f"{m.index:>3}  {'HOLD' if m.holding else '    '}  {m.submitted:>9,}"
            f"  {ms(m.claim_p(50)):>7} / {ms(m.claim_p(95)):>7}"
            f"  {ms(m.latency_p(50)):>6} / {ms(m.latency_p(95)):>6}  {m.queued_max:>10,}"
            f"  {jobs.dead:>7,} / {jobs.bytes / 2**20:>5.1f}  {m.autovacuums['jobs']:>2}"
            f"  {share(m.hot_share['jobs']):>4}"
            f"  {events.dead:>8,} / {events.bytes / 2**20:>5.1f}  {m.autovacuums['job_events']:>2}"
            f"  {share(m.hot_share['job_events']):>4}")


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FALL SHORT"


def targets(minutes: list[Minute], args: argparse.Namespace) -> list[str]:
    lines = []
    first, last = minutes[0].claim_p(95), minutes[-1].claim_p(95)
    if first is not None and last is not None:
        ratio = last / first
        lines.append(f"target claim p95, last minute <= {TARGET_RATIO}x the first: {ratio:.2f}x"
                     f" ({ms(last)} vs {ms(first)} ms) {verdict(ratio <= TARGET_RATIO)}")
    else:
        lines.append("target claim p95, last minute against the first: not measured")
    if args.hold_minutes <= 0:
        return lines
    hold_start = round(args.hold_at)
    hold_end = round(args.hold_at + args.hold_minutes)  # the last minute the hold was open in
    pre = [m for m in minutes if m.index <= hold_start]
    pre = [m for m in pre if m.index > 1] or pre
    post = [m for m in minutes if m.index > hold_end]
    claims = [m.claim_p(95) for m in pre]
    ends = [m.latency_p(95) for m in pre]
    if not pre or not post or None in claims or None in ends:
        lines.append("target recovery within 2 minutes of the hold's end: not measured"
                     " (no minute before or after the hold)")
        return lines
    claim_level = TARGET_RATIO * statistics.median(c for c in claims if c is not None)
    e2e_level = TARGET_RATIO * statistics.median(e for e in ends if e is not None)

    def recovered(m: Minute) -> bool:
        claim, e2e = m.claim_p(95), m.latency_p(95)
        return claim is not None and e2e is not None and claim <= claim_level and e2e <= e2e_level

    since = None  # the first minute after the hold from which every later one is back
    for m in post:
        since = (m.index if since is None else since) if recovered(m) else None
    within = since is not None and since - hold_end <= RECOVERY_MINUTES
    back = "not back by the end" if since is None else f"back from minute {since}"
    lines.append(f"target recovery within {RECOVERY_MINUTES} minutes of the hold's end (minute"
                 f" {hold_end}): claim p95 <= {ms(claim_level)} ms and e2e p95 <="
                 f" {ms(e2e_level)} ms ({TARGET_RATIO}x the pre-hold median): {back}"
                 f" {verdict(within)}")
    return lines + hold_32_targets(minutes, hold_start + 1, hold_end)


def hold_32_targets(minutes: list[Minute], hold_first: int, hold_last: int) -> list[str]:
    """Issue 32's targets (bench/hold_targets.py), the same bench.hold judges: the hold's last
    minute and the first after it against the minute before, and the tables' size at the end."""
    p95s = [P95s(m.claim_p(95), m.latency_p(95)) for m in minutes]
    lines = hold_lines("Space Jobs", around_hold(p95s, hold_first, hold_last))

    def size(m: Minute) -> int:
        return sum(m.tables[t].bytes for t in TABLES)

    before = minutes[hold_first - 2] if 2 <= hold_first <= len(minutes) + 1 else None
    lines.append(size_line("Space Jobs", size(before) if before else None, size(minutes[-1]),
                           "the size of jobs + job_events"))
    return lines


@contextlib.contextmanager
def servers_for(args: argparse.Namespace) -> Iterator[tuple[str, str, str]]:
    """(superuser URL, Redis URL, where they come from) for the run."""
    if args.private:
        with private_postgres() as admin_url:
            yield (admin_url, os.environ.get("REDIS_URL", MACHINE_REDIS_URL),
                   f"private PostgreSQL {PRIVATE_MAJOR}, default settings")
        return
    with measured_on(args.embedded) as (admin_url, redis_url):
        yield admin_url, redis_url, "embedded" if args.embedded else "DATABASE_URL"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    clean_up_on_signals()
    settings = {"SPACEJOBS_BENCH_KINDS": "1"}
    os.environ.update(settings)
    reload_settings()
    load_kinds()
    directory = Path(tempfile.mkdtemp(prefix="sj-soak-"))
    minutes: list[Minute] = []
    plans: list[Plan] = []
    failure = None
    try:
        with servers_for(args) as (admin_url, redis_url, source):
            servers = Servers(admin_url, redis_url, source)
            print("A steady load with a reporting transaction held open (issue 17, part 4)",
                  flush=True)
            print(f"command   : python -m bench.soak {' '.join(argv if argv is not None else sys.argv[1:])}",
                  flush=True)
            print(f"servers   : PostgreSQL {servers.postgres_version()} ({servers.source}),"
                  f" Redis {redis_url.split('@')[-1]}; {os.cpu_count()} CPUs shared with both"
                  " servers", flush=True)
            print(f"load      : {args.rate:g} bench.noop/s in {TICKS_PER_SECOND} batches/s over"
                  f" {args.organizations} organizations for {args.minutes:g} x"
                  f" {args.minute_seconds:g} s; {args.workers} worker(s) -c {args.concurrency} and beat,"
                  f" sweep interval {args.sweep_interval or 'the default'}", flush=True)
            found = server_settings(admin_url)
            print("vacuum    : " + ", ".join(f"{k} {v}" for k, v in found.items()), flush=True)
            if found["autovacuum"] != "on":
                print("WARNING   : autovacuum is off on this server: no dead row is ever removed,"
                      " so these figures say nothing of production (use --private or --embedded)", flush=True)
            print(f"retention : finished jobs, results and events kept {args.keep_minutes:g} min"
                  " (the database's policy, purged by the sweeper)", flush=True)
            print(f"hold      : REPEATABLE READ, one read, then idle in transaction from minute"
                  f" {args.hold_at:g} for {args.hold_minutes:g} min", flush=True)
            print(f"claim     : claim_jobs(limit 1) timed {args.probe_rate:g}/s in a rolled-back"
                  " transaction, as the worker role", flush=True)
            (directory / "logs").mkdir()
            stack = Stack(servers, directory / "logs", label="soak", process_settings=settings)
            try:
                days = args.keep_minutes / (24 * 60)
                stack.set_retention(jobs_days=days, results_days=days, events_days=days)
                soak = Soak(stack, args)
                print("", flush=True)
                print(HEADER, flush=True)
                try:
                    minutes = soak.run()
                except Exception as error:
                    failure = f"{error}"
                plans = soak.plans
            finally:
                stack.stop()
                servers.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print("")
    for plan in plans:
        print(f"claim plan {plan.summary()}")
        for notice in plan.notices:
            say(notice)
    if minutes:
        for line in targets(minutes, args):
            print(line)
    if failure:
        print(f"FAILED: {failure}")
    return 1 if failure or not minutes or not any(m.claims for m in minutes) else 0


if __name__ == "__main__":
    sys.exit(main())
