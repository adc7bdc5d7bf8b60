"""What one submit costs: ``models.jobs.service.submit`` in a loop, each in its own transaction as
the web opens it (space_app, scoped to the organization and the user), and ``submit_many``
batches of 100. No broker and no worker: this is the database's share of a ``POST …/jobs``.
A third figure is the single submit's function alone (submit_jobs() of one job), called in a
loop inside the database (submit_cost.sql): the function's own cost, without the client, the
round trips and the commits, which is what a schema change moves and what a busy machine blurs
least.

    DATABASE_URL=postgresql://postgres@127.0.0.1/postgres .venv/bin/python -m bench.submit_cost \\
        [--jobs 1000] [--rounds 9] [--against ADMIN_URL_OF_ANOTHER_DATABASE | --against-tree DIR]

A fresh database is made for the run (dropped at the end). ``--against`` names a database that
another checkout migrated (say main's, for a before/after of a schema change): it is seeded the
same way and timed in alternate rounds with this checkout's, by the same client code, so both
see the same machine; on a shared machine that is the only comparison worth printing.
``--against-tree`` names another checkout (say a worktree of main) whose client code differs
too (a changed submit signature): each round runs that checkout's own ``bench.submit_cost`` and
this one's, one round each in a process of its own, in alternating order. Each round's figure
is a mean over ``--jobs`` submits; the median of the rounds is printed with their spread.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from uuid import UUID

import psycopg
from sqlalchemy import Engine

from spacejobs.models.db.engine import libpq_url, make_engine, with_database
from spacejobs.models.db.migrate import upgrade
from spacejobs.models.db.queries import queries_beside
from spacejobs.models.db.roles import APP_ROLE, role_url
from spacejobs.models.db.transaction import owner_transaction, transaction
from spacejobs.models.jobs import service
from spacejobs.models.jobs.service import Jobs
from spacejobs.models.kinds import load_kinds
from spacejobs.models.tenancy import accounts

Q = queries_beside(__file__)
KIND = "bench.noop"
BATCH = 100


@dataclass
class Figures:
    """One checkout's figures, ms per job, one per round."""

    label: str
    singles: list[float] = field(default_factory=list)
    batches: list[float] = field(default_factory=list)
    inside: list[float] = field(default_factory=list)
    #: what the in-database figure loops (this checkout's: the single submit's function)
    inside_label: str = "submit_jobs() of one"


@dataclass(kw_only=True)
class Target(Figures):
    """One database to time: its web-role engine and the member who submits."""

    app: Engine
    org: UUID
    user: UUID

    @property
    def jobs(self) -> Jobs:
        return Jobs(self.app)

    def one(self) -> None:
        with transaction(self.app, organization_id=self.org, user_id=self.user,
                         actor=f"user:{self.user}") as conn:
            self.jobs.submit(conn, KIND, {}, organization_id=self.org, requested_by=self.user)

    def batch(self) -> None:
        with transaction(self.app, organization_id=self.org, user_id=self.user,
                         actor=f"user:{self.user}") as conn:
            self.jobs.submit_many(conn, [service.JobRequest(KIND)] * BATCH,
                                organization_id=self.org, requested_by=self.user)

    def in_database(self, jobs: int) -> float:
        """ms per submit_jobs() call of one job, looped inside one DO block."""
        with transaction(self.app, organization_id=self.org, user_id=self.user,
                         actor=f"user:{self.user}") as conn:
            conn.execute(Q["prepare"], {"org": str(self.org), "user": str(self.user),
                                        "jobs": str(jobs)})
            conn.execute(Q["in_database"])
            return conn.execute(Q["elapsed_ms"]).scalar_one() / jobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.submit_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000, help="submits per round")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--against", help="admin URL of a database another checkout migrated")
    parser.add_argument("--against-tree", help="another checkout, timed with its own client code")
    args = parser.parse_args(argv)
    server = os.environ.get("DATABASE_URL")
    if not server:
        parser.error("DATABASE_URL must name a server (a role that may create databases)")
    if args.against_tree:
        return alternate(Path(__file__).resolve().parents[1], Path(args.against_tree), args.jobs,
                         args.rounds)
    os.environ["SPACEJOBS_BENCH_KINDS"] = "1"
    # Every round's jobs stay queued in one organization (no worker): under the default quota
    # the second round was refused. The quota still runs at every submit; its cost does not
    # depend on the limit (the count is kept by the jobs triggers).
    os.environ.setdefault("SPACEJOBS_ACTIVE_JOBS_QUOTA", str(10**9))
    from spacejobs.models.settings import reload_settings

    reload_settings()
    load_kinds()

    name = f"sj_submit_cost_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(libpq_url(server), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    db_url = with_database(server, name)
    engines: list[Engine] = []
    try:
        upgrade(db_url)
        targets = [seed("this checkout", db_url, engines)]
        if args.against:
            targets.append(seed("--against", args.against, engines))
        for target in targets:
            for _ in range(200):  # warm the pool, the plans and the caches
                target.one()
        for _ in range(args.rounds):
            for target in targets:
                target.singles.append(_mean_ms(target.one, args.jobs))
                target.batches.append(_mean_ms(target.batch, max(1, args.jobs // BATCH)) / BATCH)
                target.inside.append(target.in_database(args.jobs))
        print(f"ms per job, median of {args.rounds} rounds of {args.jobs} jobs (min, max):")
        for target in targets:
            _print(target)
    finally:
        for engine in engines:
            engine.dispose()
        with psycopg.connect(libpq_url(server), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


def _print(target: Figures) -> None:
    print(f"  {target.label}: submit, one per transaction {_figure(target.singles)}; "
          f"submit_many, {BATCH} per transaction {_figure(target.batches)}; "
          f"{target.inside_label} looped in the database {_figure(target.inside)}")


_FIGURES = re.compile(r"this checkout: submit, one per transaction ([\d.]+) .*; submit_many, "
                      r"\d+ per transaction ([\d.]+) .*; (.+) looped in the database ([\d.]+) ")


def alternate(here: Path, there: Path, jobs: int, rounds: int) -> int:
    """Each checkout's own ``bench.submit_cost``, one round per process, in alternating order."""
    targets = {"this checkout": Figures("this checkout"),
               "--against-tree": Figures("--against-tree")}
    trees = [("this checkout", here), ("--against-tree", there)]
    for index in range(rounds):
        for label, tree in trees if index % 2 == 0 else trees[::-1]:
            done = subprocess.run(
                [sys.executable, "-m", "bench.submit_cost", "--jobs", str(jobs), "--rounds", "1"],
                cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True,
                text=True, check=True)
            found = _FIGURES.search(done.stdout)
            if found is None:
                raise RuntimeError(f"no figures from {tree}: {done.stdout[-2000:]}")
            target = targets[label]
            target.singles.append(float(found[1]))
            target.batches.append(float(found[2]))
            target.inside_label = found[3]
            target.inside.append(float(found[4]))
    print(f"ms per job, median of {rounds} rounds of {jobs} jobs, each round a process of its own "
          f"(min, max):")
    for target in targets.values():
        _print(target)
    return 0


def seed(label: str, admin_url: str, engines: list[Engine]) -> Target:
    admin = make_engine(admin_url, pool_size=1)
    app = make_engine(role_url(APP_ROLE, admin_url), pool_size=1)
    engines += [admin, app]
    with owner_transaction(admin, actor="bench") as conn:
        org = accounts.create_organization(conn, f"bench-submit-cost-{uuid.uuid4().hex[:6]}")
        user = accounts.create_user(conn, f"bench-{uuid.uuid4().hex[:8]}@example.test").id
        accounts.add_member(conn, org, user, "member")
    return Target(label, app=app, org=org, user=user)


def _mean_ms(call: Callable[[], None], times: int) -> float:
    started = time.perf_counter()
    for _ in range(times):
        call()
    return 1000 * (time.perf_counter() - started) / times


def _figure(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} (min {min(values):.3f}, max {max(values):.3f})"


if __name__ == "__main__":
    raise SystemExit(main())
