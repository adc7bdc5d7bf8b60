"""Throughput and latency of Space Jobs with real Celery worker processes, next to plain Celery.

Run from the repository root (the servers are optional: without them the embedded ones start):

    DATABASE_URL=postgresql://postgres@127.0.0.1/postgres REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python -m bench.throughput [--jobs 5000] [--quick]

Each run gets a fresh database (dropped at the end) and fresh queue names. Every figure about
what the workers did is read from the database (job rows and their events) or, for plain
Celery, from Redis counters the tasks keep: never from the workers' own reports.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import event, text

from models.db.engine import libpq_url
from models.jobs.records import TERMINAL
from tests.kit import broker, facts
from tests.kit.processes import WORKER_READY, celery_worker_argv, clean_up_on_signals
from tests.kit.seeding import Tenant
from tests.kit.servers import Servers, find_or_start
from tests.kit.stack import Stack

KIND = "bench.noop"
CONCURRENCY = 2


class BenchError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------

def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile: always a value that was actually observed."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def _query_name(queries: dict[str, Any], statement: str, dialect: Any) -> str:
    """The name of a models SQL block (``-- name --``) that compiles to ``statement``."""
    for name, clause in queries.items():
        if str(clause.compile(dialect=dialect)).strip() == statement.strip():
            return name
    return statement.split()[0].lower() + " (unnamed statement)"


def _rate(count: int, seconds: float, unit: str = "jobs") -> str:
    return f"{count / seconds:,.0f} {unit}/s" if seconds > 0 else "n/a"


def _log(message: str) -> None:
    # Progress goes to stderr so stdout carries only the report.
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def paced(rate: float, count: int, send: Callable[[], None]) -> float:
    """Call ``send`` ``count`` times on a fixed schedule; a late call is made at once, never
    skipped, so a slow sender shows up as a lower achieved rate. Returns the elapsed seconds."""
    start = time.perf_counter()
    for index in range(count):
        delay = start + index / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send()
    return time.perf_counter() - start


# ---------------------------------------------------------------------------------------------
# The run's stack (tests/kit): its database, queue, processes and tenants
# ---------------------------------------------------------------------------------------------

def plain_queue(stack: Stack) -> str:
    """Plain Celery's queue, named after the run like the stack's own."""
    return f"plain-bench-{stack.run_id}"


def seed_tenant(stack: Stack, label: str) -> Tenant:
    """One organization per phase, so each phase's rows are told apart by organization_id."""
    return stack.tenant(f"bench-{label}")


# ---------------------------------------------------------------------------------------------
# What the database says about a phase
# ---------------------------------------------------------------------------------------------

@dataclass
class PhaseRows:
    total: int
    completed: int
    single_attempt: int
    ordered_times: int
    clean_events: int
    diagnostics: int
    claims_by_actor: dict[str, int]
    first_created: Any
    last_created: Any
    first_started: Any
    last_finished: Any

    def invariants(self, expected: int) -> tuple[bool, str]:
        ok = (self.total == self.completed == self.single_attempt == self.ordered_times
              == self.clean_events == expected and self.diagnostics == 0)
        claims = " / ".join(str(n) for n in self.claims_by_actor.values())
        return ok, (f"{self.completed}/{expected} completed, {self.single_attempt} in 1 attempt, "
                    f"{self.clean_events} with events exactly queued>leased>completed, "
                    f"{self.ordered_times} with created<=started<=finished, "
                    f"{self.diagnostics} diagnostics, claims by {len(self.claims_by_actor)} "
                    f"processes ({claims})")


def count_finished(stack: Stack, org: uuid.UUID) -> int:
    with stack.admin() as conn:
        counts = facts.counts_by_status(conn, org)
    return sum(counts[status] for status in TERMINAL)


def phase_rows(stack: Stack, org: uuid.UUID) -> PhaseRows:
    with stack.admin() as conn:
        row = conn.execute(text(
            "SELECT count(*) AS total,"
            " count(*) FILTER (WHERE status = 'completed') AS completed,"
            " count(*) FILTER (WHERE attempts = 1) AS single_attempt,"
            " count(*) FILTER (WHERE created_at <= started_at AND started_at <= finished_at)"
            "   AS ordered_times,"
            " min(created_at) AS first_created, max(created_at) AS last_created,"
            " min(started_at) AS first_started, max(finished_at) AS last_finished"
            " FROM jobs WHERE organization_id = :org"), {"org": org}).mappings().one()
        clean_events = conn.execute(text(
            "SELECT count(*) FROM (SELECT job_id FROM job_events WHERE organization_id = :org"
            " GROUP BY job_id HAVING array_agg(to_status ORDER BY id)"
            " = ARRAY['queued', 'leased', 'completed']) s"), {"org": org}).scalar_one()
        diagnostics = conn.execute(
            text("SELECT count(*) FROM job_diagnostics WHERE organization_id = :org"),
            {"org": org}).scalar_one()
        claims = dict(conn.execute(text(
            "SELECT actor, count(*) FROM job_events WHERE organization_id = :org"
            " AND to_status = 'leased' GROUP BY actor ORDER BY actor"), {"org": org}).all())
    return PhaseRows(row["total"], row["completed"], row["single_attempt"], row["ordered_times"],
                     clean_events, diagnostics, claims, row["first_created"], row["last_created"],
                     row["first_started"], row["last_finished"])


def latencies(stack: Stack, org: uuid.UUID) -> list[float]:
    with stack.admin() as conn:
        return [float(v) for v in conn.execute(text(
            "SELECT extract(epoch FROM finished_at - created_at) FROM jobs"
            " WHERE organization_id = :org AND status = 'completed'"), {"org": org}).scalars()]


def wait_finished(stack: Stack, org: uuid.UUID, expected: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (done := count_finished(stack, org)) < expected:
        stack.processes.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"only {done}/{expected} jobs finished after {timeout:.0f}s")
        time.sleep(0.2)


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------

@dataclass
class Report:
    header: list[tuple[str, str]] = field(default_factory=list)
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)

    def row(self, number: str, figure: str, value: str, detail: str = "") -> None:
        self.rows.append((number, figure, value, detail))

    def check(self, phase: str, ok: bool, detail: str) -> None:
        self.checks.append((phase, ok, detail))

    def render(self, *, complete: bool) -> str:
        title = "Space Jobs throughput benchmark" + ("" if complete else "  (INCOMPLETE: run failed)")
        lines = [title, "=" * len(title)]
        width = max((len(k) for k, _ in self.header), default=0)
        lines += [f"{key.ljust(width)} : {value}" for key, value in self.header]
        lines.append("")
        fig_w = max((len(r[1]) for r in self.rows), default=10)
        val_w = max((len(r[2]) for r in self.rows), default=10)
        head = f"{'#':<3}{'figure'.ljust(fig_w)}  {'value'.ljust(val_w)}  detail"
        lines += [head, "-" * max(len(head), 100)]
        # Stable sort by number: the store is measured before the web path, but reads after it.
        ordered = sorted(self.rows, key=lambda r: r[0])
        lines += [f"{n:<3}{f.ljust(fig_w)}  {v.ljust(val_w)}  {d}".rstrip() for n, f, v, d in ordered]
        if self.checks:
            lines += ["", "Invariants (read from the database / Redis, not from worker reports)",
                      "-" * 100]
            phase_w = max(len(c[0]) for c in self.checks)
            lines += [f"{p.ljust(phase_w)}  {'OK  ' if ok else 'FAIL'}  {d}" for p, ok, d in self.checks]
        if self.extra:
            lines += ["", *self.extra]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Phases
# ---------------------------------------------------------------------------------------------

def enqueue_store(stack: Stack, report: Report, n: int) -> None:
    """The store's own rate: store.submit in a space_app transaction, then the wake-up."""
    from models.db.transaction import transaction
    from models.jobs import store
    from models.kinds import get_kind
    from tasks.wakeups import WakeupPublisher

    tenant = seed_tenant(stack, "store")
    app_db = stack.app_db
    publisher = WakeupPublisher(stack.redis_url, stack.queue)
    kind = get_kind(KIND).rules  # store.submit takes the rules (models/ restructuring)
    in_tx = in_publish = 0.0
    _log(f"enqueue through the store: {n} jobs")
    started = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        with transaction(app_db, organization_id=tenant.organization_id, user_id=tenant.user_id,
                         actor=f"user:{tenant.user_id}") as conn:
            job, _created = store.submit(conn, organization_id=tenant.organization_id,
                                        requested_by=tenant.user_id, kind=kind, params={})
        t1 = time.perf_counter()
        if not publisher.wake(str(job.id)):
            raise BenchError("wake-up not published")
        in_publish += time.perf_counter() - t1
        in_tx += t1 - t0
    elapsed = time.perf_counter() - started
    report.row("1b", "enqueue rate, store (submit + publish)", _rate(n, elapsed),
               f"{n} in {elapsed:.2f} s: transaction {1000 * in_tx / n:.2f} ms"
               f" + wake-up publish {1000 * in_publish / n:.2f} ms per job")
    # These rows were only for the rate: remove them and their wake-ups so the drain below
    # starts from exactly N queued jobs.
    with stack.admin() as conn:
        conn.execute(text("DELETE FROM jobs WHERE organization_id = :org"),
                     {"org": tenant.organization_id})
    broker.purge_queue(stack.redis_url, stack.queue)
    with psycopg.connect(libpq_url(stack.admin_url), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE jobs, job_events")


def enqueue_web(stack: Stack, report: Report, client: Any, n: int) -> Tenant:
    """The web path; with no worker running these jobs become the drain phase's backlog."""
    tenant = seed_tenant(stack, "drain")
    url = f"/api/v1/orgs/{tenant.organization_id}/jobs"
    _log(f"enqueue through the web app (no worker running): {n} jobs")
    started = time.perf_counter()
    for _ in range(n):
        answer = client.post(url, json={"kind": KIND}, headers=tenant.auth)
        if answer.status_code != 202:
            raise BenchError(f"submit answered {answer.status_code}: {answer.get_data(as_text=True)}")
    elapsed = time.perf_counter() - started
    report.row("1a", "enqueue rate, web (POST .../jobs)", _rate(n, elapsed),
               f"{n} POSTs in {elapsed:.2f} s ({1000 * elapsed / n:.2f} ms each), all 202;"
               " Flask test client, 1 thread, commit then wake-up")
    return tenant


def drain(stack: Stack, report: Report, tenant: Tenant, n: int) -> float:
    waiting = broker.redis_client(stack.redis_url).llen(stack.queue)
    _log(f"starting the Space Jobs worker; {n} queued jobs, {waiting} wake-ups waiting")
    argv = celery_worker_argv("tasks.celery_app", stack.queue, "sj-bench", CONCURRENCY)
    stack.processes.start("spacejobs-worker", argv, stack.env(), ready=WORKER_READY)
    wait_finished(stack, tenant.organization_id, n, timeout=max(120, n / 10))
    rows = phase_rows(stack, tenant.organization_id)
    seconds = (rows.last_finished - rows.first_started).total_seconds()
    report.row("2", "drain rate, pre-filled queue", _rate(n, seconds),
               f"{n} jobs, first claim -> last finish {seconds:.2f} s (started_at/finished_at);"
               f" {waiting} wake-ups waiting (one per submit)")
    ok, detail = rows.invariants(n)
    report.check("drain", ok, detail)
    # As the admin itself: how much of pg_stat_activity a non-privileged role (the owner) may
    # see differs between PostgreSQL versions.
    with stack.admin_db.connect() as conn:
        roles = conn.execute(text(
            "SELECT usename, count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name LIKE 'spacejobs-worker%' GROUP BY usename")).all()
    report.check("worker role", [r[0] for r in roles] == ["space_worker"],
                 "worker connections in pg_stat_activity: "
                 + ", ".join(f"{r[0]} x{r[1]}" for r in roles))
    leftover = broker.purge_queue(stack.redis_url, stack.queue)
    report.extra.append(f"After the drain, {leftover} of the {waiting} wake-ups were still in Redis"
                        " (surplus: each wake-up drains up to SPACEJOBS_DRAIN_LIMIT jobs); purged.")
    return n / seconds


def end_to_end(stack: Stack, report: Report, client: Any, n: int) -> None:
    tenant = seed_tenant(stack, "e2e")
    url = f"/api/v1/orgs/{tenant.organization_id}/jobs"
    _log(f"end to end with the worker running: {n} jobs")
    started = time.perf_counter()
    for _ in range(n):
        answer = client.post(url, json={"kind": KIND}, headers=tenant.auth)
        if answer.status_code != 202:
            raise BenchError(f"submit answered {answer.status_code}")
    submit_seconds = time.perf_counter() - started
    backlog = n - count_finished(stack, tenant.organization_id)
    wait_finished(stack, tenant.organization_id, n, timeout=max(120, n / 10))
    rows = phase_rows(stack, tenant.organization_id)
    seconds = (rows.last_finished - rows.first_created).total_seconds()
    report.row("3", "end-to-end rate (workers running)", _rate(n, seconds),
               f"{n} jobs, first submit -> last finish {seconds:.2f} s; submits alone "
               f"{_rate(n, submit_seconds)}, {backlog} unfinished when the last submit returned")
    ok, detail = rows.invariants(n)
    report.check("end to end", ok, detail)


def latency(stack: Stack, report: Report, client: Any, rate: float, seconds: float) -> None:
    tenant = seed_tenant(stack, "latency")
    url = f"/api/v1/orgs/{tenant.organization_id}/jobs"
    count = max(2, round(rate * seconds))
    _log(f"latency: {count} jobs at {rate:g}/s")
    failures = 0

    def send() -> None:
        nonlocal failures
        if client.post(url, json={"kind": KIND}, headers=tenant.auth).status_code != 202:
            failures += 1

    elapsed = paced(rate, count, send)
    if failures:
        raise BenchError(f"{failures} submits failed during the latency phase")
    wait_finished(stack, tenant.organization_id, count, timeout=120)
    values = [1000 * v for v in latencies(stack, tenant.organization_id)]
    report.row("4", f"latency created_at->finished_at at {rate:g}/s",
               f"p50 {percentile(values, 50):.1f} ms",
               f"p95 {percentile(values, 95):.1f} ms, p99 {percentile(values, 99):.1f} ms, "
               f"max {max(values):.1f} ms; {count} jobs over {elapsed:.1f} s "
               f"(achieved {count / elapsed:.1f}/s), web path")
    ok, detail = phase_rows(stack, tenant.organization_id).invariants(count)
    report.check("latency", ok, detail)


def plain_celery(stack: Stack, report: Report, n: int, rate: float, seconds: float,
                 spacejobs_drain: float) -> None:
    from bench import plain_celery as plain

    plain.configure(stack.redis_url, plain_queue(stack))
    client = broker.redis_client(stack.redis_url)
    drain_key = f"plain-bench:{stack.run_id}:drain"
    latency_key = f"plain-bench:{stack.run_id}:latency"
    _log(f"plain Celery: publishing {n} no-op tasks (no worker running)")
    started = time.perf_counter()
    with plain.app.producer_or_acquire() as producer:
        for _ in range(n):
            plain.noop.apply_async(kwargs={"key": drain_key, "total": n}, producer=producer)
    publish_seconds = time.perf_counter() - started
    report.row("5a", "plain Celery publish rate", _rate(n, publish_seconds, "tasks"),
               f"{n} apply_async in {publish_seconds:.2f} s (compare 1a/1b)")

    argv = celery_worker_argv("bench.plain_celery", plain_queue(stack), "plain-bench", CONCURRENCY)
    stack.processes.start("plain-worker", argv, stack.env(PLAIN_BENCH_QUEUE=plain_queue(stack)),
                          ready=WORKER_READY)
    deadline = time.monotonic() + max(120, n / 10)
    while int(client.get(f"{drain_key}:count") or 0) < n:
        stack.processes.check_alive()
        if time.monotonic() > deadline:
            raise BenchError("plain Celery drain did not finish")
        time.sleep(0.1)
    first = float(client.get(f"{drain_key}:first") or 0)
    last = float(client.get(f"{drain_key}:last") or 0)
    plain_seconds = last - first
    report.row("5b", "plain Celery drain rate, pre-published", _rate(n, plain_seconds, "tasks"),
               f"{n} tasks, first start -> last done {plain_seconds:.2f} s (Redis INCR counter)")
    count_ok = int(client.get(f"{drain_key}:count") or 0) == n
    report.check("plain drain", count_ok and client.llen(plain_queue(stack)) == 0,
                 f"Redis counter {int(client.get(f'{drain_key}:count') or 0)}/{n}, queue empty")

    count = max(2, round(rate * seconds))
    _log(f"plain Celery latency: {count} tasks at {rate:g}/s")
    with plain.app.producer_or_acquire() as producer:
        elapsed = paced(rate, count, lambda: plain.noop.apply_async(
            kwargs={"key": latency_key, "sent_at": time.time()}, producer=producer))
    deadline = time.monotonic() + 60
    while client.llen(f"{latency_key}:latency") < count:
        if time.monotonic() > deadline:
            raise BenchError("plain Celery latency tasks did not all run")
        time.sleep(0.1)
    values = [1000 * float(v) for v in client.lrange(f"{latency_key}:latency", 0, -1)]
    report.row("5c", f"plain Celery latency sent->done at {rate:g}/s",
               f"p50 {percentile(values, 50):.1f} ms",
               f"p95 {percentile(values, 95):.1f} ms, p99 {percentile(values, 99):.1f} ms, "
               f"max {max(values):.1f} ms; {count} tasks over {elapsed:.1f} s")
    plain_rate = n / plain_seconds
    report.row("5d", "ratio Space Jobs / plain Celery (drain)", f"{spacejobs_drain / plain_rate:.3f}",
               f"{spacejobs_drain:,.0f} / {plain_rate:,.0f} per second (2 / 5b)")
    client.delete(*client.keys(f"plain-bench:{stack.run_id}:*"))


def claim_cost(stack: Stack, report: Report, finished_rows: int, samples: int) -> None:
    """Single claims on a table with 0 and then ``finished_rows`` finished jobs, no worker running."""
    from models.db.transaction import scope, transaction
    from models.jobs import store

    tenant = seed_tenant(stack, "claims")
    worker_db = stack.worker_db
    params = {"org": tenant.organization_id, "user": tenant.user_id}

    def reset(finished: int) -> None:
        with stack.admin() as conn:
            conn.execute(text("TRUNCATE jobs CASCADE"))
            if finished:
                conn.execute(text(
                    "INSERT INTO jobs (organization_id, requested_by, kind, status, lease_seconds,"
                    " max_attempts, attempts, result, run_after, created_at, updated_at,"
                    " started_at, finished_at)"
                    " SELECT :org, :user, 'bench.noop', 'completed', 30, 3, 1, '{}', t, t, t, t,"
                    "        t + interval '5 milliseconds'"
                    " FROM (SELECT now() - g * interval '1 second' AS t"
                    "       FROM generate_series(1, :n) g) s"), {**params, "n": finished})
            conn.execute(text(
                "INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds, max_attempts)"
                " SELECT :org, :user, 'bench.noop', 30, 3 FROM generate_series(1, :n)"),
                {**params, "n": samples})
            conn.execute(text("ANALYZE jobs"))

    def timed_claims(expect_job: bool) -> list[float]:
        values = []
        for _ in range(samples):
            t0 = time.perf_counter()
            with transaction(worker_db, actor="worker:bench") as conn:
                leased = store.claim_batch(conn, "bench", limit=1)
            values.append(1000 * (time.perf_counter() - t0))
            if bool(leased) != expect_job:
                raise BenchError("claim returned an unexpected result")
        return values

    def captured_claim(expect_job: bool) -> list[tuple[str, Any]]:
        """The statements a one-job store.claim_batch sends (whatever they are today), with parameters."""
        seen: list[tuple[str, Any]] = []

        def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
            seen.append((statement, parameters))

        with worker_db.connect() as conn:
            event.listen(conn, "before_cursor_execute", record)
            with conn.begin() as trans:
                scope(conn, actor="worker:bench")
                seen.clear()  # only the claim's own statements
                if bool(store.claim_batch(conn, "explain", limit=1)) != expect_job:
                    raise BenchError("claim returned an unexpected result")
                trans.rollback()
            event.remove(conn, "before_cursor_execute", record)
        return seen

    def explain(statements: list[tuple[str, Any]], state: str) -> list[tuple[str, str, list[str]]]:
        plans = []
        with worker_db.connect() as conn, conn.begin() as trans:
            scope(conn, actor="worker:bench")
            for statement, parameters in statements:
                code = re.sub(r"^\s*(--[^\n]*\n\s*)*", "", statement)
                if code.split(None, 1)[0].upper() not in ("SELECT", "WITH", "UPDATE", "INSERT", "DELETE"):
                    continue  # SAVEPOINT and the like have no plan
                plan = conn.exec_driver_sql(
                    "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + statement, parameters
                ).scalars().all()
                plans.append((_query_name(store.Q, statement, conn.dialect), state, plan))
            trans.rollback()  # EXPLAIN ANALYZE really leased a row
        return plans

    with transaction(worker_db) as conn:
        conn.execute(text("SELECT 1"))  # connect before timing
    plans: list[tuple[str, str, list[str]]] = []
    for finished in (0, finished_rows):
        _log(f"claim cost with {finished} finished rows")
        reset(finished)
        if finished:
            # Plans of what a claim sends while jobs are queued (rolled back: nothing is taken).
            hit_statements = captured_claim(True)
            plans = explain(hit_statements, f"{samples} queued")
        hit = timed_claims(True)
        empty = timed_claims(False)
        if finished:
            # An empty queue also tries the expired leases: plan those statements as well, with
            # statistics that know about the leases just taken (as autovacuum's would).
            with stack.admin() as conn:
                conn.execute(text("ANALYZE jobs"))
            known = {statement for statement, _ in hit_statements}
            plans += explain([(st, pa) for st, pa in captured_claim(False) if st not in known],
                             f"queue empty, {samples} leased")
        report.row("6", f"claim cost, {finished:,} finished rows",
                   f"mean {sum(hit) / len(hit):.2f} ms",
                   f"p95 {percentile(hit, 95):.2f} ms over {samples} claims (each its own transaction);"
                   f" empty queue: mean {sum(empty) / len(empty):.2f} ms, p95 {percentile(empty, 95):.2f} ms")
    for name, state, plan in plans:
        used = sorted(set(re.findall(r"(?:Index Scan|Index Only Scan|Bitmap Index Scan)"
                                     r"(?: Backward)? (?:using|on) (\w+)", "\n".join(plan))))
        seq_scan = any("Seq Scan on jobs" in line for line in plan)
        # The brief's requirement is the claimable index for the main claim; for the others it is
        # enough that no plan reads the whole jobs table (finished rows included).
        wanted = "jobs_claimable_idx" if name in ("claim_queued", "claim_batch") else None
        report.check(f"plan {name}", not seq_scan and (wanted is None or wanted in used),
                     f"with {finished_rows:,} finished rows: indexes {', '.join(used) or 'none'}"
                     f"{'; SEQ SCAN on jobs' if seq_scan else ', no scan of the whole jobs table'}")
        report.extra += [f"EXPLAIN ANALYZE {name} (worker role, {finished_rows:,} finished rows,"
                         f" {state}; the statement as models.jobs.store.claim_batch sends it):",
                         *("    " + line for line in plan)]


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def machine(servers: Servers) -> list[tuple[str, str]]:
    redis_version = broker.redis_client(servers.redis_url).info("server").get("redis_version", "?")
    return [
        ("machine", f"{os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), "
                    f"{platform.system()} {platform.release()} {platform.machine()}"),
        ("software", f"Python {platform.python_version()}, PostgreSQL {servers.postgres_version()}, "
                     f"Redis {redis_version}"),
        ("servers", f"{servers.source}; the benchmark client, the workers, PostgreSQL and Redis "
                    "share this machine's CPUs"),
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, help="N jobs per phase (default 5000; 500 with --quick)")
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--rate", type=float, default=50, help="paced rate for latency (per second)")
    parser.add_argument("--latency-seconds", type=float,
                        help="length of the paced latency runs (default 20; 4 with --quick)")
    parser.add_argument("--claim-rows", type=int,
                        help="finished rows for the claim-cost figure (default 100000; 20000 with"
                             " --quick; 0 skips it)")
    parser.add_argument("--claim-samples", type=int, default=200)
    args = parser.parse_args(argv)
    args.jobs = args.jobs or (500 if args.quick else 5000)
    args.latency_seconds = args.latency_seconds or (4 if args.quick else 20)
    if args.claim_rows is None:
        args.claim_rows = 20_000 if args.quick else 100_000
    if args.jobs < 1 or args.rate <= 0:
        parser.error("--jobs and --rate must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["SPACEJOBS_BENCH_KINDS"] = "1"  # bench.noop in this process too (web app, store)
    clean_up_on_signals()
    load_at_start = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    tmp = Path(tempfile.mkdtemp(prefix="spacejobs-bench-"))
    report = Report()
    servers: Servers | None = None
    stack: Stack | None = None
    complete = False
    try:
        servers = find_or_start(tmp / "servers")
        _log(f"servers: {servers.source}; migrating a template database and cloning it")
        # The workers need nothing of the test suite's settings: no beat, no extra kinds.
        stack = Stack(servers, tmp, label="bench", process_settings={})
        report.header += machine(servers)
        drain_limit = os.environ.get("SPACEJOBS_DRAIN_LIMIT", "50")
        report.header += [
            ("parameters", f"N={args.jobs} jobs per phase, kind {KIND}, latency at {args.rate:g}/s "
                           f"for {args.latency_seconds:g} s, SPACEJOBS_DRAIN_LIMIT={drain_limit}"),
            ("workers", f"1 x `celery -A tasks.celery_app worker -c {CONCURRENCY}` (prefork: "
                        f"{CONCURRENCY} processes), log level INFO to a file, no beat/sweeper; "
                        f"plain Celery the same with -A bench.plain_celery"),
            ("run", f"database {stack.db_name}, queues {stack.queue} / {plain_queue(stack)} "
                    "(created for this run, removed at the end)"),
        ]

        client = stack.make_app().test_client()

        enqueue_store(stack, report, args.jobs)
        drain_tenant = enqueue_web(stack, report, client, args.jobs)
        drain_rate = drain(stack, report, drain_tenant, args.jobs)
        end_to_end(stack, report, client, args.jobs)
        latency(stack, report, client, args.rate, args.latency_seconds)
        stack.processes.stop_all()
        broker.purge_queue(stack.redis_url, stack.queue)
        plain_celery(stack, report, args.jobs, args.rate, args.latency_seconds, drain_rate)
        stack.processes.stop_all()
        if args.claim_rows:
            claim_cost(stack, report, args.claim_rows, args.claim_samples)
        complete = True
    except KeyboardInterrupt:
        _log("interrupted")
    except SystemExit:
        _log("terminated by a signal")
        raise
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)  # let the cleanup finish
        _cleanup(servers, stack, tmp)
        if report.rows:
            # Other processes on a small machine skew every figure: say how busy it was.
            report.header.append(("load average", f"{load_at_start} at start, "
                                  + " / ".join(f"{v:.2f}" for v in os.getloadavg()) + " at end (1/5/15 min)"))
            print(report.render(complete=complete), flush=True)
    failed = [c for c in report.checks if not c[1]]
    return 0 if complete and not failed else 1


def _cleanup(servers: Servers | None, stack: Stack | None, tmp: Path) -> None:
    """Stop the workers, remove the queues, drop the databases, stop embedded servers; keep the
    logs only if a step failed."""
    steps: list[Callable[[], None]] = []
    if stack is not None:
        steps.append(lambda: broker.forget_queues(stack.redis_url, plain_queue(stack),
                                                  f"{plain_queue(stack)}.sweep"))
        steps.append(stack.stop)
    if servers is not None:
        steps.append(servers.close)
    errors = []
    for step in steps:
        try:
            step()
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    for error in errors:
        _log(f"cleanup: {error}")
    if errors:
        _log(f"worker logs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
