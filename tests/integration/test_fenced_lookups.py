"""Behind a long-open transaction, the worker's fenced statements find their jobs by key: a
finish, a lease check and the requester's standing read about as many buffers after thousands of
jobs went through the queue as before. They name a job by its id and lease token, and its
status among the leased ones; before revision 0053 the planner read the partial index of held
leases for them instead of jobs_pkey, and a hold fills that index with the entry of every lease
taken since it began (25 minutes into a hold at 200 jobs/s, a finish of 20 jobs read 32,000
buffers)."""

from __future__ import annotations

import json
import uuid

from sqlalchemy import text

from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.jobs.records import LeasedJob
from tests.integration.maintenance_kit import (
    buffers_read,
    drain_queue,
    plant_queued,
    report_left_open,
    run_through,
)
from tests.kit.stack import Stack


def held_leases(stack: Stack, org: uuid.UUID, user: uuid.UUID, count: int) -> list[LeasedJob]:
    plant_queued(stack, org, user, count)
    with transaction(stack.worker_db, actor="worker:w1") as conn:
        leased = store.claim_batch(conn, "w1", limit=count)
    assert len(leased) == count
    return leased


def fenced_buffers(stack: Stack, leased: list[LeasedJob]) -> dict[str, int]:
    """Buffers each fenced statement reads for these leases, each run and rolled back."""
    ids = [str(job.id) for job in leased]
    tokens = [str(job.lease_token) for job in leased]
    return {
        "finish": buffers_read(stack, "SELECT * FROM complete_jobs(%s::uuid[], %s::uuid[],"
                               " %s::jsonb[], %s::text[])",
                               (ids, tokens, [json.dumps({})] * len(ids), [None] * len(ids))),
        "standing": buffers_read(stack, "SELECT * FROM lease_standing(%s::uuid[], %s::uuid[])",
                                 (ids, tokens)),
        "lock": buffers_read(stack, "SELECT lock_lease(%s::uuid, %s::uuid)", (ids[0], tokens[0])),
    }


def analyze(stack: Stack) -> None:
    """Statistics as autovacuum would leave them: many jobs, few of them leased (the planner
    then counts the partial index of held leases as small, whatever a hold left in it)."""
    with stack.admin() as conn:
        conn.execute(text("ANALYZE jobs"))


def test_behind_a_held_transaction_fenced_statements_read_their_jobs_by_key(bare_stack: Stack):
    stack = bare_stack
    drain_queue(stack)
    org = stack.org()
    user = stack.user(org, role="owner").id
    with report_left_open(stack):
        run_through(stack, org, user, 1000)
        analyze(stack)
        first = fenced_buffers(stack, held_leases(stack, org, user, 20))
        drain_queue(stack)
        run_through(stack, org, user, 3000)
        analyze(stack)
        after = fenced_buffers(stack, held_leases(stack, org, user, 20))
        drain_queue(stack)
    # through the partial index of held leases, each read every one of the 3,000 leases more
    for statement in first:
        assert after[statement] <= first[statement] + 50, (statement, first, after)
