"""What the maintenance chores' integration tests share: a beat's process on a stack (its worker
engine, a recording publisher, the stack's results store), jobs put by hand where a chore
finds them (a lease run out, a moment passed), through the real statements and roles, and a
long-open transaction with the buffers a statement reads behind it."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import psycopg
from sqlalchemy import text

from spacejobs.models.db.engine import libpq_url
from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.jobs.records import Job, LeasedJob
from spacejobs.models.kinds import get_kind
from spacejobs.models.settings import get_settings
from tests.integration.leasing import claim_one, complete_one
from tests.kit.stack import Stack


class Publisher:
    """The publisher's ``wake``: records the job ids it was given; the broker is up."""

    def __init__(self) -> None:
        self.woken: list[str] = []

    def __call__(self, job_id: str, *, force: bool = False) -> bool:
        assert force  # a chore's wake-ups are forced past the coalescing guard
        self.woken.append(job_id)
        return True


def as_beat(stack: Stack, publisher: Publisher | None = None, **settings: Any) -> SimpleNamespace:
    """The worker process a beat runs its chores as, on this stack (``settings`` override the
    process's own)."""
    return SimpleNamespace(engine=stack.worker_db,
                           publisher=SimpleNamespace(wake=publisher or Publisher()),
                           settings=get_settings().model_copy(update=settings),
                           results=stack.results, jobs=stack.jobs)


def new_job(stack: Stack, kind: str = "bench.noop", *, org: uuid.UUID | None = None,
            params: dict[str, Any] | None = None) -> Job:
    org = org or stack.org()
    user = stack.user(org, role="owner")
    with transaction(stack.app_db, organization_id=org, user_id=user.id, actor="test") as conn:
        job, created = store.submit(conn, [store.NewJob(get_kind(kind).rules, params or {})],
                                    organization_id=org, requested_by=user.id)[0]
    assert created == "created"
    return job


def claim(stack: Stack, worker: str = "w1", *, actor: str | None = None) -> LeasedJob:
    """The next due job, leased by ``worker`` as its process would (the transaction's actor
    ``worker:<worker>``), or under ``actor``."""
    with transaction(stack.worker_db, actor=actor or f"worker:{worker}") as conn:
        leased = claim_one(conn, worker)
    assert leased is not None
    return leased


def drain_queue(stack: Stack) -> None:
    """Complete every due job, so a test starts from an empty queue."""
    while True:
        with transaction(stack.worker_db) as conn:
            leased = claim_one(conn, "drain")
            if leased is None:
                return
            complete_one(conn, leased.id, leased.lease_token, {})


def expire_lease(stack: Stack, job_id: uuid.UUID) -> None:
    # Test set-up through the owner role: make the lease run out without waiting for it.
    with stack.admin() as conn:
        conn.execute(text("UPDATE jobs SET lease_until = now() - interval '1 second'"
                          " WHERE id = :id"), {"id": job_id})


def waiting(stack: Stack, *, until: datetime | None = None, signal: str | None = None) -> LeasedJob:
    """A job that ran and now waits (for a moment, or a signal), by the lease holder's own
    statement. A moment in the past is made by moving it back afterwards (the statement itself
    queues a job whose moment has already come)."""
    drain_queue(stack)
    new_job(stack, "bench.wait", params={"seconds": 1})
    leased = claim(stack)
    later = datetime.now(UTC) + timedelta(hours=1)
    with transaction(stack.worker_db, actor="worker:w1") as conn:
        status = store.wait_job(conn, leased.id, leased.lease_token,
                                until=None if signal else later, signal=signal, children=None)
    assert status == "waiting"
    if until is not None:
        with stack.admin() as conn:
            conn.execute(text("UPDATE jobs SET wait_until = :until WHERE id = :id"),
                         {"until": until, "id": leased.id})
    return leased


def status_of(stack: Stack, job_id: uuid.UUID) -> str:
    return str(stack.job_row(job_id)["status"])


@contextmanager
def report_left_open(stack: Stack) -> Iterator[None]:
    """A REPEATABLE READ transaction on another connection, its snapshot taken and kept: vacuum
    removes nothing it may still see until it ends."""
    with psycopg.connect(libpq_url(stack.admin_url)) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM jobs").fetchone()
        try:
            yield
        finally:
            conn.rollback()


def buffers_read(stack: Stack, statement: str, params: tuple[Any, ...] = ()) -> int:
    """Shared buffers (hit and read) the statement reads, run and rolled back, so it changes
    nothing. The second of two in one session: the first also reads the catalog to plan a
    function's statements."""
    with psycopg.connect(libpq_url(stack.admin_url)) as conn:
        for _ in range(2):
            plan = "\n".join(str(row[0]) for row in conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS) " + statement, params))  # type: ignore[arg-type]
        conn.rollback()
    top = re.search(r"Buffers: shared ([^\n]*)", plan)
    assert top is not None, plan
    return sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", top.group(1)))


def plant_queued(stack: Stack, org: uuid.UUID, user: uuid.UUID, count: int, *,
                 age: str = "0 seconds", lease_seconds: int = 30) -> None:
    """``count`` queued jobs of the organization, created ``age`` ago, through the owner role
    (the jobs triggers run as for any insert)."""
    with stack.admin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds, max_attempts,"
            " run_after, created_at)"
            " SELECT :org, :user, 'bench.noop', :lease, 3, now() - CAST(:age AS interval),"
            " now() - CAST(:age AS interval) FROM generate_series(1, :count)"),
            {"org": org, "user": user, "count": count, "age": age, "lease": lease_seconds})


def run_through(stack: Stack, org: uuid.UUID, user: uuid.UUID, count: int, *,
                lease_seconds: int = 30) -> None:
    """``count`` jobs submitted, claimed and completed, a hundred at a time."""
    for _ in range(count // 100):
        plant_queued(stack, org, user, 100, lease_seconds=lease_seconds)
        with transaction(stack.worker_db, actor="worker:w1") as conn:
            leased = store.claim_batch(conn, "w1", limit=100)
            assert len(leased) == 100
            done = store.complete_batch(conn, [(job.id, job.lease_token, {}, None)
                                               for job in leased])
            assert len(done) == 100
