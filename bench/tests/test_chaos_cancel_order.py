"""The chaos run's "no step starts after its workflow's cancel", read from real rows: which
lease after the parent's cancel stamp it counts (bench/chaos/composites.sql
started_after_cancel).

The jobs trigger stamps a parent's cancel event before it stops the children; a child a claim
had locked meanwhile is stopped by the cancel's own transaction once that claim commits. Such a
lease started before the cancel did anything, and is not counted; a lease after the stamp that
the cancel's transaction did not stop is."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

import bench.chaos.composites as composites
from spacejobs.models.db.engine import libpq_url
from spacejobs.models.db.queries import queries_beside
from tests.kit.servers import Servers

Q = queries_beside(composites.__file__)


@pytest.fixture()
def database(servers: Servers) -> Iterator[str]:
    name = f"sj_cancel_order_{uuid.uuid4().hex[:8]}"
    url = servers.create_database(name, template=servers.migrated_template())
    try:
        yield url
    finally:
        servers.drop_database(name)


def event(conn: psycopg.Connection, job: uuid.UUID, org: uuid.UUID, change: tuple[str, str],
          at: str) -> None:
    conn.execute("INSERT INTO job_events (job_id, organization_id, from_status, to_status,"
                 " attempt, actor, at) VALUES (%s, %s, %s, %s, 1, 'test', %s::timestamptz)",
                 (job, org, change[0], change[1], at))


def test_only_a_lease_the_cancel_did_not_stop_counts_as_started_after_it(database: str):
    with psycopg.connect(libpq_url(database), autocommit=True) as conn:
        user = conn.execute("INSERT INTO users (email) VALUES ('a@example.com')"
                            " RETURNING id").fetchone()[0]
        org = conn.execute("INSERT INTO organizations (name) VALUES ('acme')"
                           " RETURNING id").fetchone()[0]
        parent, stopped, ran_on = (uuid.uuid4() for _ in range(3))
        conn.execute(
            "INSERT INTO jobs (id, organization_id, requested_by, kind, lease_seconds,"
            " max_attempts, parent_id, child_index, created_at)"
            " VALUES (%(p)s, %(o)s, %(u)s, 'bench.noop', 30, 3, NULL, NULL, '2026-01-01 10:00'),"
            "        (%(s)s, %(o)s, %(u)s, 'bench.noop', 30, 3, %(p)s, 0, '2026-01-01 10:00'),"
            "        (%(r)s, %(o)s, %(u)s, 'bench.noop', 30, 3, %(p)s, 1, '2026-01-01 10:00')",
            {"p": parent, "s": stopped, "r": ran_on, "o": org, "u": user})
        # Both children leased 3 ms after the parent's cancel stamp, each in its own claim.
        for child in (stopped, ran_on):
            event(conn, child, org, ("queued", "leased"), "2026-01-01 10:00:01.003")
        # The cancel's transaction: the parent's event, then the one child its trigger stopped.
        with conn.transaction():
            event(conn, parent, org, ("waiting", "cancelled"), "2026-01-01 10:00:01")
            event(conn, stopped, org, ("leased", "cancel_requested"), "2026-01-01 10:00:01.004")
        # The other child is asked to stop later, by someone else.
        event(conn, ran_on, org, ("leased", "cancel_requested"), "2026-01-01 10:00:02")
        found = [(row[1], row[3]) for row in conn.execute(Q["started_after_cancel"].text)]
    assert found == [(str(ran_on), "queued -> leased")]
