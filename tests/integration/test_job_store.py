"""The job store's transitions, against the real schema, as the real roles (no worker processes)."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from models import jobs
from models.context import JobContext
from models.db import make_engine, scope, transaction
from models.errors import InternalJobError, JobFinished, LeaseLost, NotFound
from models.kinds import get_kind, load_kinds
from tests.conftest import Stack

load_kinds()


@pytest.fixture(scope="module")
def store(bare_stack: Stack) -> Stack:
    bare_stack.app_db = make_engine(bare_stack.app_url, pool_size=2)
    return bare_stack


def new_job(stack: Stack, kind: str = "bench.noop", **kw) -> tuple[uuid.UUID, jobs.Job]:
    org = kw.pop("org", None) or stack.org()
    user = stack.user(org, role="owner")
    with transaction(stack.app_db, organization_id=org, user_id=user.id, actor="test") as conn:
        job, created = jobs.submit(conn, organization_id=org, requested_by=user.id,
                                   kind=get_kind(kind), params=kw.pop("params", {}), **kw)
    assert created
    return org, job


def claim(stack: Stack, worker: str = "w1"):
    with transaction(stack.worker_db, actor=f"worker:{worker}") as conn:
        return jobs.claim(conn, worker)


def expire_lease(stack: Stack, job_id) -> None:
    # Test set-up through the owner role: make the lease run out without waiting for it.
    with stack.admin() as conn:
        conn.execute(text("UPDATE jobs SET lease_until = now() - interval '1 second' WHERE id = :id"),
                     {"id": job_id})


def drain_queue(stack: Stack) -> None:
    while (leased := claim(stack)) is not None:
        with transaction(stack.worker_db) as conn:
            jobs.complete(conn, leased.id, leased.lease_token, {})


def test_late_finish_with_stale_token_changes_nothing(store: Stack):
    drain_queue(store)
    _, job = new_job(store)
    first = claim(store, "w1")
    assert first.id == job.id and first.attempt == 1
    expire_lease(store, job.id)
    second = claim(store, "w2")
    assert second.id == job.id and second.attempt == 2
    assert second.lease_token != first.lease_token

    with transaction(store.worker_db) as conn:
        assert jobs.complete(conn, job.id, second.lease_token, {"by": "second"})
    with transaction(store.worker_db) as conn:
        assert not jobs.complete(conn, job.id, first.lease_token, {"by": "first"})
        assert jobs.fail_attempt(conn, job.id, first.lease_token, JobFinished(), retry_in=0) is None

    row = store.job_row(job.id)
    assert (row["status"], row["result"], row["lease_token"]) == ("completed", {"by": "second"}, None)
    assert [(e["to_status"], e["attempt"]) for e in store.events(job.id)] == [
        ("queued", 0), ("leased", 1), ("leased", 2), ("completed", 2)]


def test_a_live_lease_cannot_be_taken_over_even_with_raw_sql(store: Stack):
    drain_queue(store)
    _, job = new_job(store)
    leased = claim(store)
    with pytest.raises(DBAPIError, match="leased until"), transaction(store.worker_db) as conn:
        conn.execute(text("UPDATE jobs SET lease_token = gen_random_uuid() WHERE id = :id"),
                     {"id": job.id})
    assert store.job_row(job.id)["lease_token"] == leased.lease_token


# (Status changes out of a terminal state and queued -> completed jumps are covered, with the
# row checked unchanged, in test_row_level_security.py.)
def test_a_finished_jobs_result_cannot_be_rewritten(store: Stack):
    drain_queue(store)
    _, job = new_job(store)
    leased = claim(store)
    with transaction(store.worker_db) as conn:
        assert jobs.complete(conn, job.id, leased.lease_token, {"ok": True})
    with pytest.raises(DBAPIError, match="can no longer change"), transaction(store.worker_db) as conn:
        conn.execute(text("UPDATE jobs SET result = '{\"x\": 1}' WHERE id = :id"), {"id": job.id})
    assert store.job_row(job.id)["result"] == {"ok": True}


def test_concurrent_claims_skip_each_others_rows_without_waiting(store: Stack):
    drain_queue(store)
    _, a = new_job(store)
    _, b = new_job(store)
    with store.worker_db.connect() as one, store.worker_db.connect() as two, one.begin(), two.begin():
        two.execute(text("SET LOCAL lock_timeout = '1s'"))
        first = jobs.claim(one, "one")       # row lock held until commit
        second = jobs.claim(two, "two")      # must skip it, not wait for it
        assert third_is_none(two)
    assert {first.id, second.id} == {a.id, b.id}


def third_is_none(conn) -> bool:
    return jobs.claim(conn, "two") is None


def test_tenant_writes_of_an_attempt_that_lost_its_lease_roll_back(store: Stack):
    drain_queue(store)
    org, job = new_job(store, "projects_export")
    stale = claim(store)
    expire_lease(store, job.id)
    assert claim(store).id == job.id  # a newer attempt holds it now

    ctx = JobContext(store.worker_db, stale, get_kind("projects_export").rules, actor="worker:stale")
    with pytest.raises(LeaseLost), ctx.tenant() as tenant:
        tenant.projects.create("written by a stale attempt")
    with transaction(store.worker_db, organization_id=org) as conn:
        assert conn.execute(text("SELECT count(*) FROM projects")).scalar() == 0


def test_sweeper_requeues_fails_or_cancels_expired_leases(store: Stack):
    drain_queue(store)
    _, retry = new_job(store, "bench.sleep", params={"seconds": 1})
    _, last = new_job(store, "test.stall", params={"seconds": 1})
    _, cancel = new_job(store, "bench.sleep", params={"seconds": 1})
    leases = {claim(store).id for _ in range(3)}
    assert leases == {retry.id, last.id, cancel.id}
    with store.admin() as conn:
        conn.execute(text("UPDATE jobs SET attempts = max_attempts WHERE id = :id"), {"id": last.id})
    with transaction(store.app_db, organization_id=store.job_row(cancel.id)["organization_id"]) as conn:
        assert jobs.request_cancel(conn, cancel.id, store.job_row(cancel.id)["requested_by"]).status \
            == "cancel_requested"
    for job_id in leases:
        expire_lease(store, job_id)

    with transaction(store.worker_db, actor="sweeper") as conn:
        swept = dict(jobs.sweep_expired_leases(conn))
    assert swept == {retry.id: "queued", last.id: "failed", cancel.id: "cancelled"}
    assert store.job_row(last.id)["error_code"] == "lease_expired"
    for job_id in leases:
        assert store.events(job_id)[-1]["actor"] == "sweeper"
    with transaction(store.worker_db, actor="sweeper") as conn:
        assert jobs.sweep_expired_leases(conn) == []  # nothing left to do: idempotent


def test_unsignalled_due_jobs_are_resignalled_once_per_grace_period(store: Stack):
    drain_queue(store)
    _, job = new_job(store)
    with transaction(store.worker_db) as conn:
        assert jobs.sweep_unsignalled(conn, grace=60) == []          # still within grace
    with transaction(store.worker_db) as conn:
        assert [j for j, _ in jobs.sweep_unsignalled(conn, grace=0)] == [job.id]
    with transaction(store.worker_db) as conn:
        assert jobs.sweep_unsignalled(conn, grace=1) == []           # just re-signalled


def test_jobs_put_back_in_the_queue_are_resignalled_without_waiting_for_the_grace(store: Stack):
    """A retry, an expired lease and a release at shutdown each clear last_wakeup_at: if their
    own wake-up is lost they are re-signalled at the next sweep, not a grace period later."""
    drain_queue(store)
    ids = [new_job(store)[1].id for _ in range(3)]
    leases = {job.id: job for job in (claim(store) for _ in range(3))}
    retried, expired, released = (leases[i] for i in ids)
    with transaction(store.worker_db) as conn:
        assert jobs.fail_attempt(conn, retried.id, retried.lease_token, InternalJobError(),
                                 retry_in=0) == "queued"
        assert jobs.release(conn, released.id, released.lease_token)
    expire_lease(store, expired.id)
    with transaction(store.worker_db, actor="sweeper") as conn:
        assert dict(jobs.sweep_expired_leases(conn)) == {expired.id: "queued"}
    with transaction(store.worker_db) as conn:
        again = {j for j, _ in jobs.sweep_unsignalled(conn, grace=60)}

    assert again == set(ids)
    new_job(store)
    with transaction(store.worker_db) as conn:
        assert jobs.sweep_unsignalled(conn, grace=60) == []  # a new job waits for its own wake-up


def test_cancel_queued_is_immediate_running_is_requested_finished_is_refused(store: Stack):
    drain_queue(store)
    org, queued = new_job(store)
    user = store.job_row(queued.id)["requested_by"]

    def cancel(job_id):
        with transaction(store.app_db, organization_id=org, user_id=user) as conn:
            return jobs.request_cancel(conn, job_id, user)

    assert cancel(queued.id).status == "cancelled"
    _, running = new_job(store, org=org)
    leased = claim(store)
    assert cancel(running.id).status == "cancel_requested"
    assert cancel(running.id).status == "cancel_requested"  # asking twice changes nothing
    # The job finished before it saw the request: completion wins, and stays.
    with transaction(store.worker_db) as conn:
        assert jobs.complete(conn, running.id, leased.lease_token, {"done": True})
    with pytest.raises(JobFinished):
        cancel(running.id)
    with pytest.raises(NotFound):
        cancel(uuid.uuid4())
    assert [e["to_status"] for e in store.events(running.id)] == [
        "queued", "leased", "cancel_requested", "completed"]


def test_claim_reads_the_partial_index_however_many_jobs_finished(store: Stack):
    org, _ = new_job(store)
    user = store.job_row(_.id)["requested_by"]
    with store.admin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (organization_id, requested_by, kind, status, lease_seconds,"
            " max_attempts, attempts, finished_at)"
            " SELECT :org, :user, 'bench.noop', 'completed', 30, 3, 1, now()"
            " FROM generate_series(1, 20000)"), {"org": org, "user": user})
        conn.execute(text("ANALYZE jobs"))
    query = jobs.Q["claim_queued"].text.replace(":lease_token", "gen_random_uuid()") \
        .replace(":worker", "'explain'").replace(":skip_kinds", "'{}'")
    with store.worker_db.connect() as conn, conn.begin():
        plan = "\n".join(r[0] for r in conn.execute(text("EXPLAIN " + query)))
        conn.rollback()
    assert "jobs_claimable_idx" in plan, plan


def test_two_sweepers_take_disjoint_expired_leases_without_waiting(store: Stack):
    """Beat may run on several hosts: concurrent sweeps must neither block nor double-handle."""
    drain_queue(store)
    ids = [new_job(store)[1].id for _ in range(2)]
    for _ in ids:
        claim(store)
    for job_id in ids:
        expire_lease(store, job_id)
    with store.worker_db.connect() as one, store.worker_db.connect() as two, one.begin(), two.begin():
        two.execute(text("SET LOCAL lock_timeout = '1s'"))
        for conn in (one, two):
            scope(conn, actor="sweeper")
        first = dict(jobs.sweep_expired_leases(one, batch=1))   # its row stays locked
        second = dict(jobs.sweep_expired_leases(two, batch=10))  # skips it, takes the other
    assert len(first) == len(second) == 1
    assert set(first) | set(second) == set(ids)
    assert [e["actor"] for job_id in ids for e in store.events(job_id)].count("sweeper") == 2
