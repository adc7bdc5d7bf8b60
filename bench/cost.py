"""python -m bench.cost: what a job costs the database over its whole life (issue 32).

On a new PostgreSQL 15 of its own (bench.servers ``private_postgres``: default settings,
autovacuum on, nobody else's WAL), for each system in turn, ``--jobs`` no-op jobs:

1. the system's tables emptied and VACUUMed, their size read, a CHECKPOINT (every system then
   pays the same full-page images for the first change of each page);
2. the enqueue, no worker running: one job per call (Space Jobs' ``service.enqueue``, PgQueuer's
   ``Queries.enqueue``, Procrastinate's ``defer_async``) or 1,000 per call (``submit_many``,
   ``Queries.enqueue`` of lists);
3. the drain: ``--processes`` worker processes on the system's defaults (bench/peers), until
   every job finished, each exactly once by the system's own records;
4. ``VACUUM`` of the database: what autovacuum would do after them.

Per job: WAL bytes (``pg_current_wal_lsn()`` deltas) of the enqueue and of the whole life (1 to
4), rows written (``n_tup_ins + n_tup_upd + n_tup_del`` of every table), commits in the drain
(``pg_stat_database.xact_commit``, less this benchmark's own polls) and the drain's rate (first
start to last finish, the system's records); and the growth of every table with its indexes per
1,000 finished jobs after the VACUUM. With pg_walinspect (PostgreSQL 15 ships it), Space Jobs'
WAL by relation, for the single enqueue and the whole life, and its growth by relation. Beside
them the floor: pgbench's plain one-row INSERT, one a transaction. Then issue 32's targets,
each PASS or FALL SHORT.

The statistics are read ``--settle`` seconds after each step: a backend reports its counts at
most once a second at a transaction's end, or 10 s after it went idle.

Exits non-zero only when a figure could not be measured (a worker died, a job ran twice).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench.harness import poll
from bench.peers.base import PeerError, PostgresPeer, drain_timeout, statements_beside
from bench.servers import MACHINE_REDIS_URL, PRIVATE_MAJOR, private_bindir, private_postgres
from spacejobs.models.db.engine import libpq_url, with_database
from tests.kit.processes import LoggedProcess, clean_up_on_signals

SQL = statements_beside(__file__)
BULK = 1000
#: issue 32's targets
WAL_LIMIT = 2.5 * 1024  # bytes per job over its whole life, single submits
DRAIN_RATIO = 1.1
COMMITS_PER_JOB = 0.02


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per system and way")
    parser.add_argument("--processes", type=int, default=2, help="worker processes in the drain")
    parser.add_argument("--only", choices=("spacejobs", "pgqueuer", "procrastinate", "floor"),
                        action="append", help="measure only this (repeatable; default all)")
    parser.add_argument("--relations", type=int, default=8,
                        help="relations named in the WAL-by-relation lines, largest first")
    parser.add_argument("--settle", type=float, default=11,
                        help="seconds for the statistics to arrive (smaller only for a smoke run)")
    args = parser.parse_args(argv)
    if args.jobs < 2 or args.processes < 1 or args.settle < 0 or args.relations < 1:
        parser.error("at least two jobs and one process")
    return args


class Database:
    """A superuser's autocommit connection to the measured system's database, counting the
    statements it runs (each one a commit pg_stat_database counts)."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(libpq_url(url), autocommit=True)
        self.statements = 0

    def value(self, name: str, **params: Any) -> Any:
        self.statements += 1
        return self.conn.execute(SQL[name], params).fetchone()[0]  # type: ignore[index]

    def scalar(self, statement: str) -> Any:
        """The value of a statement of the system's driver (its ``.sql`` file's, by text)."""
        self.statements += 1
        return self.conn.execute(statement).fetchone()[0]  # type: ignore[index]

    def rows(self, name: str, **params: Any) -> list[tuple[Any, ...]]:
        self.statements += 1
        return self.conn.execute(SQL[name], params).fetchall()

    def run(self, name: str) -> None:
        self.statements += 1
        self.conn.execute(SQL[name])

    def close(self) -> None:
        self.conn.close()


class Subject(ABC):
    """One system's life cycle, through its peer driver (bench/peers)."""

    title: str
    finished_sql: str  # counts the jobs finished successfully

    @abstractmethod
    def url(self) -> str: ...

    @abstractmethod
    def clear(self) -> None: ...

    @abstractmethod
    def submit(self, n: int, batch: int) -> None:
        """``n`` jobs, ``batch`` per call, no worker running; raises unless ``n`` wait."""

    @abstractmethod
    def start_workers(self, processes: int) -> None: ...

    @abstractmethod
    def stop_workers(self) -> None: ...

    @abstractmethod
    def check_alive(self) -> None: ...

    @abstractmethod
    def outcome(self, n: int) -> tuple[Any, Any]:
        """First start and last finish; raises unless each of ``n`` jobs ran once."""

    @abstractmethod
    def cleanup(self) -> None: ...


class SpaceJobsSubject(Subject):
    def __init__(self, admin_url: str, redis_url: str) -> None:
        from bench.peers.spacejobs import SpaceJobsPeer

        self.peer = SpaceJobsPeer().prepare(admin_url, redis_url, "cost")
        self.title = "Space Jobs"
        self.finished_sql = SQL["spacejobs_finished"]
        self.worker: LoggedProcess | None = None

    def url(self) -> str:
        assert self.peer.stack is not None
        return self.peer.stack.admin_url

    def clear(self) -> None:
        self.peer._clear()

    def submit(self, n: int, batch: int) -> None:
        if batch == 1:
            for _ in range(n):
                self.peer._submit_one(self.peer.tenant)
        else:
            self.peer._submit_many(self.peer.tenant, n, batch)
        self.peer._expect_queued(n)

    def start_workers(self, processes: int) -> None:
        self.worker = self.peer._start_worker(processes)

    def stop_workers(self) -> None:
        if self.worker is not None and self.peer.stack is not None:
            self.peer.stack.processes.stop(self.worker)
        self.worker = None

    def check_alive(self) -> None:
        assert self.peer.stack is not None
        self.peer.stack.processes.check_alive()

    def outcome(self, n: int) -> tuple[Any, Any]:
        first, last, _ = self.peer._outcome(n)
        return first, last

    def cleanup(self) -> None:
        self.peer.cleanup()


class PeerSubject(Subject):
    """PgQueuer or Procrastinate, through their PostgresPeer driver."""

    def __init__(self, name: str, admin_url: str) -> None:
        from bench.peers import load_peer

        peer = load_peer(name)
        assert isinstance(peer, PostgresPeer)
        self.peer = peer.prepare(admin_url, "", f"cost_{uuid.uuid4().hex[:6]}")
        self.title = peer.title
        self.finished_sql = peer.statements["finished_count"]

    def url(self) -> str:
        assert self.peer.db is not None
        return self.peer.db.url

    def clear(self) -> None:
        self.peer.run(self.peer._clear())

    def submit(self, n: int, batch: int) -> None:
        async def submit() -> None:
            if batch == 1:
                for _ in range(n):
                    await self.peer._submit_one()
            else:
                for offset in range(0, n, batch):
                    await self.peer._submit_many(min(batch, n - offset))

        self.peer.run(submit())
        if (waiting := self.peer.scalar("waiting_count")) != n:
            raise PeerError(f"{self.title}: {waiting} jobs waiting after submitting {n}")

    def start_workers(self, processes: int) -> None:
        self.peer._start(processes)

    def stop_workers(self) -> None:
        self.peer.workers.stop_all()

    def check_alive(self) -> None:
        self.peer.workers.check_alive()

    def outcome(self, n: int) -> tuple[Any, Any]:
        return self.peer._outcome(n)

    def cleanup(self) -> None:
        self.peer.cleanup()


@dataclass
class Life:
    """What ``jobs`` jobs cost over their whole life, in totals."""

    title: str
    way: str  # "single" or "bulk"
    jobs: int
    enqueue_wal: int
    whole_wal: int
    rows_written: int
    drain_commits: int
    drain_seconds: float
    growth: int  # bytes, every table and index, after the VACUUM
    #: (relation, WAL bytes, of which full-page images), largest first (pg_walinspect)
    enqueue_relations: list[tuple[Any, ...]] = field(default_factory=list)
    whole_relations: list[tuple[Any, ...]] = field(default_factory=list)
    #: (relation, bytes it grew by after the VACUUM), largest first
    grown_relations: list[tuple[str, int]] = field(default_factory=list)

    def per_job(self, total: float) -> float:
        return total / self.jobs

    @property
    def label(self) -> str:
        return f"{self.title}, {'single submits' if self.way == 'single' else f'bulk of {BULK}'}"


def whole_life(subject: Subject, n: int, batch: int, processes: int, settle: float) -> Life:
    subject.clear()
    db = Database(subject.url())
    try:
        walinspect = True
        try:
            db.run("walinspect")
        except psycopg.Error:
            walinspect = False
        db.run("vacuum")
        size_before = db.value("tables_bytes")
        relations_before = dict(db.rows("relation_bytes"))
        db.run("checkpoint")
        time.sleep(settle)  # the clear's counts
        rows_before = db.value("rows_written")
        start = db.value("lsn")
        subject.submit(n, batch)
        enqueued = db.value("lsn")
        time.sleep(settle)  # the producer's counts, before the drain's window opens
        commits_before = db.value("commits")
        mine = db.statements
        subject.start_workers(processes)
        try:
            if not poll(lambda: db.scalar(subject.finished_sql) >= n, drain_timeout(n),
                        interval=0.1, between=subject.check_alive):
                raise PeerError(f"{subject.title}: {n} jobs not finished in time")
        finally:
            subject.stop_workers()
        time.sleep(1)  # the workers' backends end, and report as they do
        db.run("force_flush")
        polls = db.statements - mine
        commits = db.value("commits") - commits_before - polls
        first, last = subject.outcome(n)
        db.run("vacuum")
        end = db.value("lsn")
        size_after = db.value("tables_bytes")
        time.sleep(settle)
        rows = db.value("rows_written") - rows_before
        life = Life(subject.title, "single" if batch == 1 else "bulk", n,
                    wal_between(db, start, enqueued), wal_between(db, start, end), rows, commits,
                    (last - first).total_seconds(), size_after - size_before)
        life.grown_relations = sorted(
            ((name, size - relations_before.get(name, 0))
             for name, size in db.rows("relation_bytes")), key=lambda grown: -grown[1])
        if walinspect:
            # pg_walinspect reads only WAL flushed to disk; the workers commit without waiting
            # for the flush (synchronous_commit off), which the WAL writer does within a second.
            if not poll(lambda: db.value("flushed_past", lsn=end), 10, interval=0.1):
                raise PeerError(f"the WAL up to {end} was not flushed within 10 s")
            life.enqueue_relations = db.rows("wal_by_relation", start=start, end=enqueued)
            life.whole_relations = db.rows("wal_by_relation", start=start, end=end)
        return life
    finally:
        db.close()


def wal_between(db: Database, start: str, end: str) -> int:
    return int(db.value("wal_bytes", start=start, end=end))


def floor_wal(admin_url: str, n: int) -> float:
    """WAL bytes per plain one-row INSERT, one a transaction, by pgbench on one connection."""
    name = f"bench_floor_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = libpq_url(with_database(admin_url, name))
    try:
        db = Database(url)
        try:
            db.run("floor_table")
            db.run("checkpoint")
            start = db.value("lsn")
            with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
                script.write("INSERT INTO floor_jobs (payload) VALUES ('{}');\n")
                script.flush()
                subprocess.run([str(private_bindir() / "pgbench"), "-n", "-M", "prepared", "-c", "1",
                                "-t", str(n), "-f", script.name, url],
                               check=True, capture_output=True, text=True)
            bytes_ = wal_between(db, start, db.value("lsn"))
        finally:
            db.close()
        return float(bytes_) / n
    finally:
        with psycopg.connect(libpq_url(admin_url), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- the report ---------------------------------------------------------------------------------

HEADER = ("system                                  enqueue WAL  whole-life WAL  rows written"
          "  drain jobs/s  drain commits  growth KB")
UNITS = ("                                        B/job        B/job           per job     "
         "                per job        per 1,000 jobs")


def row(life: Life) -> str:
    return (f"{life.label[:38]:<38}  {life.per_job(life.enqueue_wal):>11,.0f}"
            f"  {life.per_job(life.whole_wal):>14,.0f}  {life.per_job(life.rows_written):>12.1f}"
            f"  {life.jobs / life.drain_seconds if life.drain_seconds > 0 else 0:>12,.0f}"
            f"  {life.per_job(life.drain_commits):>13.3f}"
            f"  {life.growth / life.jobs * 1000 / 1024:>9,.0f}")


def relations_line(what: str, relations: list[tuple[Any, ...]], jobs: int, top: int) -> str:
    shown = ", ".join(f"{name} {bytes_ / jobs:,.0f} B" + (f" (FPI {fpi / jobs:,.0f})" if fpi else "")
                      for name, bytes_, fpi in relations[:top])
    return f"WAL by relation, {what}, per job: {shown}"


def growth_line(what: str, grown: list[tuple[str, int]], jobs: int, top: int) -> str:
    shown = ", ".join(f"{name} {bytes_ / jobs * 1000 / 1024:,.0f} KB" for name, bytes_ in grown[:top])
    return f"growth by relation, {what}, per 1,000 jobs: {shown}"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FALL SHORT"


def targets(lives: dict[tuple[str, str], Life]) -> list[str]:
    ours, peer = lives.get(("spacejobs", "single")), lives.get(("pgqueuer", "single"))
    lines = []
    if ours is None:
        return ["targets: not measured (Space Jobs was not run)"]
    wal = ours.per_job(ours.whole_wal)
    lines.append(f"target whole-life WAL per job, single submits <= {WAL_LIMIT:,.0f} B:"
                 f" {wal:,.0f} B {verdict(wal <= WAL_LIMIT)}")

    def against(what: str, mine: float, theirs: float | None, unit: str, fmt: str) -> str:
        if theirs is None:
            return (f"target {what} <= PgQueuer's: {mine:{fmt}}{' ' + unit if unit else ''},"
                    " PgQueuer not measured")
        return (f"target {what} <= PgQueuer's: {mine:{fmt}} vs {theirs:{fmt}}"
                f"{' ' + unit if unit else ''} {verdict(mine <= theirs)}")

    lines.append(against("whole-life WAL per job, single submits", wal,
                         peer.per_job(peer.whole_wal) if peer else None, "B", ",.0f"))
    lines.append(against("rows written per job", ours.per_job(ours.rows_written),
                         peer.per_job(peer.rows_written) if peer else None, "", ".1f"))
    lines.append(against("table + index growth per 1,000 finished jobs",
                         ours.growth / ours.jobs * 1000 / 1024,
                         peer.growth / peer.jobs * 1000 / 1024 if peer else None, "KB", ",.0f"))
    if peer is not None and peer.drain_seconds > 0 and ours.drain_seconds > 0:
        ratio = (ours.jobs / ours.drain_seconds) / (peer.jobs / peer.drain_seconds)
        lines.append(f"target drain >= {DRAIN_RATIO}x PgQueuer's: {ratio:.2f}x"
                     f" ({ours.jobs / ours.drain_seconds:,.0f} vs {peer.jobs / peer.drain_seconds:,.0f}"
                     f" jobs/s) {verdict(ratio >= DRAIN_RATIO)}")
    else:
        lines.append(f"target drain >= {DRAIN_RATIO}x PgQueuer's: not measured")
    commits = ours.per_job(ours.drain_commits)
    # the level kept is the 0.02 published, to its two decimals
    lines.append(f"target commits per job in the drain <= {COMMITS_PER_JOB} (to two decimals):"
                 f" {commits:.3f} {verdict(round(commits, 2) <= COMMITS_PER_JOB)}")
    return lines


def subjects(wanted: list[str]) -> list[tuple[str, str]]:
    """(system, way) in the order measured, those whose package is installed."""
    found = []
    for name, ways in (("spacejobs", ("single", "bulk")), ("pgqueuer", ("single", "bulk")),
                       ("procrastinate", ("single",))):
        if name not in wanted:
            continue
        if name != "spacejobs":
            try:
                __import__(name)
            except ImportError:
                print(f"{name}: not measured, not installed (pip install -e '.[bench]')", flush=True)
                continue
        found += [(name, way) for way in ways]
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    clean_up_on_signals()
    redis_url = os.environ.get("REDIS_URL", MACHINE_REDIS_URL)
    wanted = args.only or ["spacejobs", "pgqueuer", "procrastinate", "floor"]
    print("What a job costs the database over its whole life (issue 32)", flush=True)
    print(f"command   : python -m bench.cost {' '.join(argv if argv is not None else sys.argv[1:])}",
          flush=True)
    print(f"server    : a new PostgreSQL {PRIVATE_MAJOR}, default settings (autovacuum on), for this"
          f" run alone; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"each      : {args.jobs:,} no-op jobs: VACUUM + CHECKPOINT, enqueue (one a call, or"
          f" {BULK:,} a call), drain by {args.processes} worker processes, VACUUM", flush=True)
    lives: dict[tuple[str, str], Life] = {}
    failures: list[str] = []
    floor: float | None = None
    with private_postgres() as admin_url:
        for name, way in subjects(wanted):
            subject: Subject | None = None
            try:
                subject = (SpaceJobsSubject(admin_url, redis_url) if name == "spacejobs"
                           else PeerSubject(name, admin_url))
                say(f"{subject.title}, {way}: {args.jobs} jobs")
                lives[(name, way)] = whole_life(subject, args.jobs, 1 if way == "single" else BULK,
                                                args.processes, args.settle)
            except Exception as error:
                failures.append(f"{name} {way}: {error}")
            finally:
                if subject is not None:
                    subject.cleanup()
        if "floor" in wanted:
            try:
                floor = floor_wal(admin_url, args.jobs)
            except (subprocess.CalledProcessError, psycopg.Error, RuntimeError) as error:
                failures.append(f"floor: {error}")
    print("", flush=True)
    print(HEADER)
    print(UNITS)
    for life in lives.values():
        print(row(life))
    if floor is not None:
        print(f"{'pgbench INSERT floor (one row a commit)':<38}  {floor:>11,.0f}")
    for way in ("single", "bulk"):
        ours = lives.get(("spacejobs", way))
        if ours is not None and ours.enqueue_relations:
            if way == "single":
                print(relations_line("Space Jobs' single enqueue", ours.enqueue_relations, ours.jobs,
                                     args.relations))
            print(relations_line(f"Space Jobs' whole life, {way}", ours.whole_relations, ours.jobs,
                                 args.relations))
        if ours is not None:
            print(growth_line(f"Space Jobs, {way}", ours.grown_relations, ours.jobs, args.relations))
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    print("")
    for line in targets(lives):
        print(line)
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures or not lives else 0


if __name__ == "__main__":
    sys.exit(main())
