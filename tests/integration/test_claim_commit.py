"""A claim commits without waiting for the WAL flush; a finish (or anything else) waits.

docs/concepts/leases-and-fencing.md says why a claim may be lost in a crash: the job goes back
to what it was and is claimed again, and the attempt that believed it held the job is fenced at
its finish. These tests look at what the server's setting is at the moment each of the worker's
transactions commits, and crash a real PostgreSQL (``pg_ctl stop -m immediate``: no shutdown
checkpoint, recovery from the WAL) right after claims.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

from spacejobs.models.db.engine import make_engine
from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.kinds import get_kind, load_kinds
from spacejobs.tasks.engine.leases import Finished, WorkerLeases
from tests.conftest import submit
from tests.kit import facts
from tests.kit.private_servers import PrivateServers
from tests.kit.stack import Stack, running_stack

STALE = "stale finish discarded"

load_kinds()


@pytest.fixture()
def watched_worker_engine(bare_stack: Stack) -> Iterator[tuple[Engine, list[str]]]:
    """A worker-role engine that notes the server's ``synchronous_commit`` as each of its
    transactions reaches COMMIT (read on the same connection, inside that transaction)."""
    engine = make_engine(bare_stack.worker_url, pool_size=1)
    seen: list[str] = []

    @event.listens_for(engine, "commit")
    def note(conn: Any) -> None:
        cursor = conn.connection.dbapi_connection.cursor()
        cursor.execute("SELECT current_setting('synchronous_commit')")
        seen.append(cursor.fetchone()[0])

    yield engine, seen
    engine.dispose()


def test_only_a_transaction_that_claims_and_finishes_nothing_skips_the_flush(
        bare_stack: Stack, watched_worker_engine: tuple[Engine, list[str]]) -> None:
    stack = bare_stack
    engine, seen = watched_worker_engine
    org = stack.org()
    owner = stack.user(org, role="owner")
    noop = get_kind("bench.noop").rules
    with transaction(stack.app_db) as conn:
        store.submit(conn, [store.NewJob(noop, {})],
                     organization_id=org, requested_by=owner.id)[0]
    with engine.connect() as conn:
        server_default = conn.execute(text("SHOW synchronous_commit")).scalar_one()
    assert server_default != "off"
    leases = WorkerLeases(engine, "commit-probe")

    claimed = leases.finish_and_claim([], claim=1).leased
    assert len(claimed) == 1
    finished = leases.finish_and_claim([Finished(claimed[0], noop, {"ok": True})], claim=1)
    assert finished.completed == claimed
    leases.extend([])  # a heartbeat with nothing held is still a transaction of its own

    assert seen == ["off", server_default, server_default]
    # The setting was the claim's transaction's alone: the pooled connection does not keep it.
    with engine.connect() as conn:
        assert conn.execute(text("SHOW synchronous_commit")).scalar_one() == server_default
    assert stack.job_row(claimed[0].id)["status"] == "completed"


@pytest.fixture()
def crashable(tmp_path: Path) -> Iterator[tuple[PrivateServers, Stack]]:
    """A PostgreSQL and Redis of this test alone, and a stack on them: the test crashes the
    database server."""
    for part in ("servers", "stack"):
        (tmp_path / part).mkdir()
    servers = PrivateServers(tmp_path / "servers")
    try:
        with running_stack(servers.servers, tmp_path / "stack") as stack:
            yield servers, stack
    finally:
        servers.close()


def test_a_crash_right_after_claims_loses_no_job_and_finishes_none_twice(
        crashable: tuple[PrivateServers, Stack]) -> None:
    servers, stack = crashable
    # The presence heartbeat is a durable commit that would flush the claims' WAL: keep it out
    # of the moment of the crash, so the claims may really be lost.
    worker = stack.start_worker(concurrency=2, SPACEJOBS_PRESENCE_INTERVAL="600")
    client = stack.make_app().test_client()
    org = stack.org()
    anna = stack.user(org, role="owner")
    jobs = [submit(client, org, anna, "bench.sleep", {"seconds": 1.0}) for _ in range(6)]
    stack.wait_for(jobs[0]["id"], "leased")
    servers.postgres.stop("immediate")
    servers.postgres.start()
    # A claim that survived the crash while its attempt did not leaves a lease to run out: beat's
    # sweeper puts that job back in the queue (the claim leaves expired leases to it).
    stack.start_beat()

    for job in jobs:
        stack.wait_for(job["id"], "completed", timeout=60)
    with transaction(stack.operator_db) as conn:
        assert facts.finished_twice(conn) == 0
        assert facts.still_leased(conn) == 0
        assert facts.broken_event_links(conn) == 0
        assert facts.status_disagrees_with_events(conn) == 0
    assert worker.alive
    # Whether the crash undid a claim depends on whether the server had written that WAL yet;
    # when it did, the attempt that ran under it was fenced: say which it was.
    stale = worker.output().count(STALE)
    print(f"claims undone by the crash, their attempts fenced at the finish: {stale}")
