"""python -m bench.storage_sketch: what a job's life would write in a narrower storage (issue 32).

    .venv/bin/python -m bench.storage_sketch [--jobs 5000] [--batch 50]

A design measurement, not the engine. On a new PostgreSQL 15 of its own (bench.servers), with
the project's schema and ``--jobs`` real jobs submitted through ``service.enqueue`` (the rows
to copy), it writes each job's whole life by hand, in plain statements (bench/storage_sketch.sql),
into copies of the real tables, in four variants:

- ``wide``: today's shape, the job's row carrying its state, with every index of ``jobs``
  (it checks the sketch: its figure should come near ``bench.cost``'s for the engine);
- ``narrow, rows deleted``: the job's row with its key and the tenant's listing only, so that
  the claim's and the finish's updates can be HOT, and the queued and the leased state in narrow
  rows of their own (the claim's two indexes on the queue, the sweeper's and the running
  count's on the leases), deleted as the job moves on;
- ``narrow, rows truncated``: the same rows never deleted one by one: the claim reads the queue
  from a cursor per organization (one row updated a claim), and the segments are truncated once
  every job in them moved on (Awa's and PgQ's rotation);
- the last without the ``queued`` event a submit writes (it says what the job's row says).

Each variant writes the same events (but that one), audit entry, quota count and metrics as
the engine, takes the same row locks (the requester's standing, the requester's key), commits
one submit per transaction and a finish with the next claim per transaction, batches of
``--batch``, then VACUUMs. Per job: the WAL of the whole life by relation (pg_walinspect, each
record counted against its first block's relation, as bench.cost counts), the rows written
(``pg_stat_user_tables``), and the tables' size after the VACUUM per 1,000 jobs.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from dataclasses import dataclass

import psycopg

from bench.cost import SQL as COST_SQL
from bench.harness import poll
from bench.peers.base import statements_beside
from bench.servers import MACHINE_REDIS_URL, private_postgres
from spacejobs.models.db.engine import libpq_url

SQL = statements_beside(__file__)
KIND = "bench.noop"
#: the locks and commits every variant takes alike, counted with its own relations
SHARED = ("memberships", "organizations", "users")


@dataclass(frozen=True)
class Variant:
    title: str
    shape: str  # the copies' prefix, and which tables and claim the variant has
    birth_event: bool


VARIANTS = (
    Variant("wide (today's shape)", "wide", birth_event=True),
    Variant("narrow, rows deleted", "narrow", birth_event=True),
    Variant("narrow, rows truncated", "rotated", birth_event=True),
    Variant("narrow, rows truncated, no birth event", "rotated", birth_event=False),
)
#: the blocks that make each shape's own tables (bench/storage_sketch.sql)
TABLES = {"wide": ("tables_wide",),
          "narrow": ("tables_narrow", "tables_narrow_deleted"),
          "rotated": ("tables_narrow", "tables_narrow_rotated")}


@dataclass(frozen=True)
class Cost:
    wal: dict[str, int]  # relation -> bytes, the variant's own and the shared ones
    rows: int
    hot_updates: int
    growth: int  # bytes of the variant's tables after the VACUUM

    def line(self, jobs: int, relations: int) -> str:
        total = sum(self.wal.values())
        top = sorted(self.wal.items(), key=lambda item: -item[1])[:relations]
        where = ", ".join(f"{name} {bytes_ / jobs:,.0f}" for name, bytes_ in top)
        return (f"WAL {total / jobs:,.0f} B a job; rows {self.rows / jobs:.1f} a job"
                f" ({self.hot_updates / jobs:.1f} HOT updates); growth"
                f" {self.growth / jobs:,.0f} KB per 1,000 jobs\n    by relation: {where}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--relations", type=int, default=12)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.jobs < args.batch or args.batch < 1:
        raise SystemExit("--jobs must be at least --batch, and --batch at least 1")
    from bench.peers.spacejobs import SpaceJobsPeer

    with private_postgres() as server:
        peer = SpaceJobsPeer().prepare(server, os.environ.get("REDIS_URL", MACHINE_REDIS_URL),
                                       "sketch")
        try:
            for _ in range(args.jobs):
                peer._submit_one(peer.tenant)
            assert peer.stack is not None
            with psycopg.connect(libpq_url(peer.stack.admin_url), autocommit=True) as conn:
                conn.execute(COST_SQL["walinspect"])
                ids = [row[0] for row in conn.execute(SQL["job_ids"])]
                print(f"{args.jobs:,} jobs' lives written by hand (bench/storage_sketch.sql),"
                      f" batches of {args.batch}, PostgreSQL {conn.info.server_version}",
                      flush=True)
                for variant in VARIANTS:
                    cost = measure(conn, variant, ids, peer.tenant.organization_id,
                                   peer.tenant.user_id, args.batch)
                    print(f"{variant.title}: {cost.line(args.jobs, args.relations)}", flush=True)
        finally:
            peer.cleanup()
    return 0


def measure(conn: psycopg.Connection, variant: Variant, ids: list[uuid.UUID],
            org: uuid.UUID, user: uuid.UUID, batch: int) -> Cost:
    shape = variant.shape
    for block in TABLES[shape]:
        run(conn, SQL[block], shape)
    run(conn, SQL["tables_common"], shape)
    run(conn, SQL["count_row"], shape, org=org, kind=KIND)
    conn.execute(SQL["vacuum"])
    conn.execute("CHECKPOINT")
    start = conn.execute(COST_SQL["lsn"]).fetchone()[0]  # type: ignore[index]
    for job_id in ids:
        with conn.transaction():
            run(conn, SQL["standing"], shape, org=org, user=user)
            run(conn, SQL["requester_key"], shape, user=user)
            run(conn, SQL["submit_job"], shape, id=job_id)
            if shape != "wide":
                run(conn, SQL["submit_queue"], shape, id=job_id)
            if variant.birth_event:
                run(conn, SQL["submit_event"], shape, id=job_id)
            run(conn, SQL["submit_audit"], shape, id=job_id)
            run(conn, SQL["count_change"], shape, org=org, delta=1)
    held: list[uuid.UUID] = []
    while True:
        with conn.transaction():
            if held:
                finish(conn, shape, held, org, user)
            held = [row[0] for row in run(conn, SQL[f"claim_{shape}"], shape, org=org,
                                          batch=batch)]
            if held:
                run(conn, SQL["lease_rows"], shape, ids=held)
                run(conn, SQL["batch_events"], shape, ids=held, org=org, **{"from": "queued"},
                    to="leased")
                run(conn, SQL["batch_metrics"], shape, kind=KIND, n=len(held),
                    names=["queue_wait_count", "queue_wait_sum"])
        if not held:
            break
    if shape == "rotated":
        conn.execute(SQL["rotate"])
    conn.execute(SQL["vacuum"])
    end = conn.execute(COST_SQL["lsn"]).fetchone()[0]  # type: ignore[index]
    if not poll(lambda: conn.execute(COST_SQL["flushed_past"], {"lsn": end}).fetchone()[0],  # type: ignore[index]
                10, interval=0.1):
        raise RuntimeError("the WAL was not flushed past the life's end within 10 s")
    prefix = f"{shape}_%"
    wal = {name: bytes_ for name, bytes_, _ in
           conn.execute(COST_SQL["wal_by_relation"], {"start": start, "end": end})
           if name.startswith(f"{shape}_") or name in SHARED or "(no relation)" in name
           # a truncated table's records name its old file, which no relation has any more
           or name == "a relation since dropped"}
    conn.execute(SQL["flush_counts"])
    conn.execute(SQL["after_flush"])
    rows, hot = conn.execute(SQL["rows_written"], {"prefix": prefix}).fetchone()  # type: ignore[misc]
    growth = conn.execute(SQL["sizes"], {"prefix": prefix}).fetchone()[0]  # type: ignore[index]
    for table in ("jobs", "events", "audit", "counts", "metrics", "queue", "leases", "cursor"):
        conn.execute(f"DROP TABLE IF EXISTS {shape}_{table}")
    return Cost(wal, rows, hot, growth)


def finish(conn: psycopg.Connection, shape: str, held: list[uuid.UUID], org: uuid.UUID,
           user: uuid.UUID) -> None:
    run(conn, SQL["standing"], shape, org=org, user=user)
    if shape == "narrow":
        run(conn, SQL["end_leases_narrow"], shape, ids=held)
    run(conn, SQL["finish_rows"], shape, ids=held)
    run(conn, SQL["batch_events"], shape, ids=held, org=org, **{"from": "leased"},
        to="completed")
    run(conn, SQL["batch_metrics"], shape, kind=KIND, n=len(held),
        names=["finished", "run_count", "run_sum", "run_bucket"])
    run(conn, SQL["count_change"], shape, org=org, delta=-len(held))


def run(conn: psycopg.Connection, statement: str, shape: str,
        **params: object) -> list[tuple[object, ...]]:
    """One statement, its tables' prefix filled in (``%(shape)s``) and its values bound."""
    text = statement.replace("%(shape)s", shape)
    cursor = conn.execute(text, params or None)
    return cursor.fetchall() if cursor.description else []


if __name__ == "__main__":
    sys.exit(main())
