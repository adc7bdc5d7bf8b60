"""The due queue's ages — the oldest due job's age /metrics shows per kind, and the one a
worker's liveness check compares with its heartbeats — are read from the claim's heads, as the
claim reads. They are the ages of every due queued job, a job made claimable behind a head that
moved on included, and no job that is not due yet; the liveness check leaves paused kinds out.
Behind a long-open transaction they read about as many buffers after thousands of jobs went
through the queue as before. Until revision 0056 both walked an index of every organization's queued
jobs from its beginning, where the transaction keeps the entry of every job queued since it
began. (What they still read: the liveness check one due job a key, from its head; /metrics
every due job, and the entries between a key's head and now, so a job due for long, which holds
its key's head back, makes a scrape read what went through since.)"""

from __future__ import annotations

import re
import uuid

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.jobs.records import KindControl
from spacejobs.models.ops import liveness, metrics
from spacejobs.tasks.maintenance.claim_heads import ClaimHeads
from tests.integration.maintenance_kit import (
    as_beat,
    drain_queue,
    plant_queued,
    report_left_open,
    run_through,
)
from tests.kit.stack import Stack


def buffers(stack: Stack, statement: str, params: dict[str, object]) -> int:
    """Shared buffers the statement reads (the second run in one transaction: the first also
    plans the functions' statements), rolled back."""
    with stack.admin() as conn:
        for _ in range(2):
            plan = "\n".join(str(row[0]) for row in conn.execute(
                text("EXPLAIN (ANALYZE, BUFFERS) " + statement), params))
    top = re.search(r"Buffers: shared ([^\n]*)", plan)
    assert top is not None, plan
    return sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", top.group(1)))


def age_reads(stack: Stack) -> dict[str, int]:
    return {"liveness": buffers(stack, str(liveness.Q["oldest_due"]), {"kinds": ["bench.noop"]}),
            "metrics": buffers(stack, str(metrics.Q["oldest_queued"]), {})}


def ages(stack: Stack) -> tuple[float, float]:
    with stack.admin() as conn:
        due = conn.execute(text(str(liveness.Q["oldest_due"])), {"kinds": ["bench.noop"]}).scalar_one()
        oldest = dict(conn.execute(text(str(metrics.Q["oldest_queued"]))).all())
    return due, float(oldest["bench.noop"])


def run_through_past(stack: Stack, org: uuid.UUID, user: uuid.UUID, count: int) -> None:
    """``count`` bench.noop jobs submitted, claimed and completed, a hundred at a time, by
    claims that leave bench.sleep's jobs queued."""
    passing_by = [KindControl("bench.sleep", paused=True, concurrency_limit=None)]
    for _ in range(count // 100):
        plant_queued(stack, org, user, 100)
        with transaction(stack.worker_db, actor="worker:w1") as conn:
            leased = store.claim_batch(conn, "w1", limit=100, controls=passing_by)
            assert len(leased) == 100
            assert len(store.complete_batch(conn, [(job.id, job.lease_token, {}, None)
                                                   for job in leased])) == 100


def test_behind_a_held_transaction_the_due_queues_ages_read_no_finished_jobs(bare_stack: Stack):
    stack = bare_stack
    drain_queue(stack)
    org: uuid.UUID = stack.org()
    user = stack.user(org, role="owner").id
    heads = ClaimHeads(interval=1, lag=0)
    reads = []
    with report_left_open(stack):
        for jobs in (1000, 3000):
            run_through(stack, org, user, jobs)
            plant_queued(stack, org, user, 5)
            heads.run(as_beat(stack))
            reads.append(age_reads(stack))
            assert ages(stack) >= (0, 0)
            drain_queue(stack)
    first, after = reads
    # from the beginning of an index of every queued job, each read the 3,000 jobs' entries
    for read in first:
        assert after[read] <= first[read] + 20, (read, first, after)


def test_the_liveness_check_reads_one_due_job_a_key_however_long_it_has_been_due(
        bare_stack: Stack):
    stack = bare_stack
    drain_queue(stack)
    org: uuid.UUID = stack.org()
    user = stack.user(org, role="owner").id
    with stack.admin() as conn:  # three jobs of another kind, due for a minute
        conn.execute(text(
            "INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds, max_attempts,"
            " run_after, created_at) SELECT :org, :user, 'bench.sleep', 30, 3,"
            " now() - interval '1 minute', now() - interval '1 minute'"
            " FROM generate_series(1, 3)"), {"org": org, "user": user})
    heads = ClaimHeads(interval=1, lag=0)
    reads = []
    with report_left_open(stack):
        for jobs in (1000, 3000):
            run_through_past(stack, org, user, jobs)
            heads.run(as_beat(stack))
            reads.append(buffers(stack, str(liveness.Q["oldest_due"]), {"kinds": ["bench.sleep"]}))
            with stack.admin() as conn:
                due = conn.execute(text(str(liveness.Q["oldest_due"])),
                                   {"kinds": ["bench.sleep"]}).scalar_one()
            assert due >= 60  # the planted jobs, due a minute ago
    drain_queue(stack)
    assert reads[1] <= reads[0] + 20, reads


def queued(stack: Stack, org: uuid.UUID, user: uuid.UUID, kind: str, *, made: str,
           due: str) -> None:
    """One queued job of ``kind``, made ``made`` ago and due ``due`` from now, as the owner."""
    with stack.admin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds, max_attempts,"
            " created_at, run_after)"
            " VALUES (:org, :user, :kind, 30, 3, now() - CAST(:made AS interval),"
            " now() + CAST(:due AS interval))"),
            {"org": org, "user": user, "kind": kind, "made": made, "due": due})


def test_the_ages_are_those_of_the_due_jobs_a_head_passed_by_included(bare_stack: Stack):
    stack = bare_stack
    drain_queue(stack)
    org: uuid.UUID = stack.org()
    user = stack.user(org, role="owner").id
    run_through(stack, org, user, 200)
    ClaimHeads(interval=1, lag=0).run(as_beat(stack))  # the head past everything so far
    # /metrics ages a job from its making, the liveness check from when it became due
    queued(stack, org, user, "bench.noop", made="1 hour", due="-30 minutes")  # behind the head
    queued(stack, org, user, "bench.sleep", made="10 minutes", due="-5 minutes")
    queued(stack, org, user, "bench.wait", made="2 hours", due="1 hour")  # not due yet
    client, operator = stack.make_app().test_client(), stack.operator()
    body = client.get("/metrics", headers=operator.auth).get_data(as_text=True)
    ages = {s.labels["kind"]: s.value for family in text_string_to_metric_families(body)
            for s in family.samples if s.name == "spacejobs_oldest_queued_job_age_seconds"}
    assert set(ages) == {"bench.noop", "bench.sleep"}
    assert 3600 <= ages["bench.noop"] < 3660 and 600 <= ages["bench.sleep"] < 660

    def oldest_due(kinds: list[str]) -> float | None:
        with stack.admin() as conn:
            return conn.execute(text(str(liveness.Q["oldest_due"])), {"kinds": kinds}).scalar_one()

    assert 1800 <= oldest_due(["bench.noop", "bench.sleep", "bench.wait"]) < 1860
    assert oldest_due(["bench.wait"]) is None
    with stack.admin() as conn:  # an operator pauses bench.noop: its jobs may wait on purpose
        conn.execute(text("INSERT INTO kind_settings (kind, paused) VALUES ('bench.noop', true)"))
    try:
        assert 300 <= oldest_due(["bench.noop", "bench.sleep"]) < 360
    finally:
        with stack.admin() as conn:
            conn.execute(text("DELETE FROM kind_settings WHERE kind = 'bench.noop'"))
        drain_queue(stack)
