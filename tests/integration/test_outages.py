"""Outages: connections killed under running workers, and a worker partitioned from PostgreSQL."""

from __future__ import annotations

import psycopg

from spacejobs.models.db.engine import libpq_url
from spacejobs.models.db.roles import WORKER_ROLE, role_url
from tests.conftest import submit
from tests.kit.stack import Stack, wait_until
from tests.netproxy import Partition, postgres_address, through


def terminate_backends(stack: Stack) -> int:
    """What a database restart does to every client: all their connections die."""
    with psycopg.connect(libpq_url(stack.admin_url), autocommit=True) as conn:
        return len(conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()", (stack.db_name,)).fetchall())


def test_web_and_workers_reconnect_after_their_connections_are_killed(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    before = submit(client, org, anna, "bench.noop")
    stack.wait_for(before["id"], "completed")
    assert terminate_backends(stack) > 0
    after = submit(client, org, anna, "projects_export")  # the web's pool re-connects
    stack.wait_for(after["id"], "completed")               # and so do the workers'


def test_worker_cut_off_mid_job_is_replaced_and_its_late_finish_is_fenced(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    client = stack.make_app().test_client()
    partition = Partition(postgres_address(stack.admin_url))
    worker_url = through(role_url(WORKER_ROLE, stack.admin_url), partition)
    cut_off = stack.start_worker(concurrency=1, SPACEJOBS_WORKER_DATABASE_URL=worker_url)
    # Lease 2 s, no checkpoints. The first attempt outlasts the cut (a new worker and beat start,
    # the lease runs out, the job is leased again), so its late finish reaches the database after
    # the cut heals and is fenced there; a finish tried during the cut would only fail to connect.
    job = submit(client, org, anna, "test.stall", {"seconds": 15, "retry_seconds": 0.5})
    first = stack.wait_for(job["id"], "leased")
    partition.cut()
    stack.start_worker(concurrency=1)
    stack.start_beat()
    # (The second attempt may be short-lived: the new worker's floor claims the job as soon as
    # its lease runs out, so wait for the attempt count, not for a status it may have left.)
    retried = wait_until(lambda: (row := stack.job_row(job["id"]))["attempts"] >= 2 and row,
                         timeout=15, what="a second attempt")
    assert retried["lease_token"] != first["lease_token"]
    partition.open_again()

    done = stack.wait_for(job["id"], "completed", timeout=30)
    assert (done["attempts"], done["result"]["attempt"]) == (2, 2)
    cut_off.wait_for_log("stale finish discarded", timeout=20)
    assert stack.job_row(job["id"])["result"] == done["result"]
    assert [e["to_status"] for e in stack.events(job["id"])].count("completed") == 1
