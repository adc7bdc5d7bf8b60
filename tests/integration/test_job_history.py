"""A job's history (job_history): its birth read from its row, then its stored events, then
the lease and completion its row holds.

A submit writes no event row for the birth, and a job that ran once and completed none for its
lease or its completion (bench.cost counts the WAL that saves); the history reads the same all
the same: who asked, as whom, who ran it, in order, and when. A lease that ends any other way (a
retry, a cancel asked for, an expiry) is stored when it ends, as it was."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text

from spacejobs.models.db.transaction import transaction
from spacejobs.models.errors import InternalJobError
from spacejobs.models.jobs import store
from spacejobs.models.jobs.records import LeasedJob
from tests.conftest import operator_retry, submit
from tests.integration.leasing import claim_one, complete_one
from tests.integration.maintenance_kit import claim, drain_queue, expire_lease
from tests.kit.seeding import TestUser
from tests.kit.stack import Stack


@pytest.fixture(scope="module")
def client(bare_stack: Stack) -> Any:
    # No worker reads the queue: the wake-ups go to a broker nobody listens to.
    return bare_stack.make_app(BROKER_URL="redis://127.0.0.1:1/0").test_client()


def stored_events(stack: Stack, job_id: object) -> int:
    with stack.admin() as conn:
        return conn.execute(text("SELECT count(*) FROM job_events WHERE job_id = :id"),
                            {"id": job_id}).scalar_one()


def queued_job(stack: Stack, client: Any) -> tuple[Any, TestUser, str]:
    """An organization, its owner, and a no-op job she submitted through the API: the only due
    job, so the next claim takes it."""
    drain_queue(stack)
    org = stack.org()
    anna = stack.user(org, role="owner")
    return org, anna, submit(client, org, anna, "bench.noop")["id"]


def lease(stack: Stack, job: str, worker: str, actor: str | None = None) -> LeasedJob:
    leased = claim(stack, worker, actor=actor)
    assert str(leased.id) == job
    return leased


def complete(stack: Stack, leased: LeasedJob, worker: str) -> None:
    with transaction(stack.worker_db, actor=f"worker:{worker}") as conn:
        assert complete_one(conn, leased.id, leased.lease_token, {})


def moves(stack: Stack, job: str) -> list[tuple[str | None, str, int, str]]:
    return [(e["from_status"], e["to_status"], e["attempt"], e["actor"])
            for e in stack.events(job)]


def test_a_job_that_ran_once_stores_no_event_and_its_history_reads_from_its_row(
        bare_stack: Stack, client):
    _, anna, job = queued_job(bare_stack, client)
    row = bare_stack.job_row(job)
    assert stored_events(bare_stack, job) == 0
    assert bare_stack.events(job) == [{"from_status": None, "to_status": "queued", "attempt": 0,
                                       "actor": f"user:{anna.id}", "at": row["created_at"]}]
    assert row["submitted_as"] is None

    leased = lease(bare_stack, job, "w1")
    assert moves(bare_stack, job) == [(None, "queued", 0, f"user:{anna.id}"),
                                      ("queued", "leased", 1, "worker:w1")]
    complete(bare_stack, leased, "w1")
    history = bare_stack.events(job)
    row = bare_stack.job_row(job)
    assert moves(bare_stack, job) == [(None, "queued", 0, f"user:{anna.id}"),
                                      ("queued", "leased", 1, "worker:w1"),
                                      ("leased", "completed", 1, "worker:w1")]
    assert history[0]["at"] < history[1]["at"] < history[2]["at"] == row["finished_at"]
    assert (history[1]["at"], row["leased_by"]) == (row["lease_event_at"], "w1")
    assert stored_events(bare_stack, job) == 0


def test_a_job_leased_and_completed_in_one_transaction_reads_its_completion_after_its_lease(
        bare_stack: Stack, client):
    """The row's completion is dated finished_at, its transaction's start; in the transaction
    that also leased it, that moment is before the lease's, and the history still reads them in
    order."""
    _, anna, job = queued_job(bare_stack, client)
    with transaction(bare_stack.worker_db, actor="worker:w1") as conn:
        leased = claim_one(conn, "w1")
        assert leased is not None and str(leased.id) == job
        assert complete_one(conn, leased.id, leased.lease_token, {})
    history = bare_stack.events(job)
    assert moves(bare_stack, job) == [(None, "queued", 0, f"user:{anna.id}"),
                                      ("queued", "leased", 1, "worker:w1"),
                                      ("leased", "completed", 1, "worker:w1")]
    assert history[1]["at"] == history[2]["at"] > bare_stack.job_row(job)["finished_at"]
    assert stored_events(bare_stack, job) == 0


def test_a_retried_job_stores_its_first_lease_when_it_goes_back_to_the_queue(
        bare_stack: Stack, client):
    _, anna, job = queued_job(bare_stack, client)
    first = lease(bare_stack, job, "w1")
    leased_at = bare_stack.job_row(job)["lease_event_at"]
    with transaction(bare_stack.worker_db, actor="worker:w1") as conn:
        assert store.fail_attempt(conn, first.id, first.lease_token, InternalJobError(),
                                  retry_in=0) == "queued"
    assert stored_events(bare_stack, job) == 2  # the first lease, as it was, and the retry
    second = lease(bare_stack, job, "w2")
    complete(bare_stack, second, "w2")
    history = bare_stack.events(job)
    assert moves(bare_stack, job) == [(None, "queued", 0, f"user:{anna.id}"),
                                      ("queued", "leased", 1, "worker:w1"),
                                      ("leased", "queued", 1, "worker:w1"),
                                      ("queued", "leased", 2, "worker:w2"),
                                      ("leased", "completed", 2, "worker:w2")]
    assert history[1]["at"] == leased_at
    assert [e["at"] for e in history] == sorted(e["at"] for e in history)
    assert stored_events(bare_stack, job) == 2


def test_a_cancel_asked_for_while_it_runs_stores_the_lease_and_each_move_after_it(
        bare_stack: Stack, client):
    org, anna, job = queued_job(bare_stack, client)
    leased = lease(bare_stack, job, "w1")
    answer = client.post(f"/api/v1/orgs/{org}/jobs/{job}/cancel", headers=anna.auth)
    assert answer.status_code in (200, 202), answer.get_json()
    complete(bare_stack, leased, "w1")  # too late to cancel: it completes all the same
    assert moves(bare_stack, job) == [(None, "queued", 0, f"user:{anna.id}"),
                                      ("queued", "leased", 1, "worker:w1"),
                                      ("leased", "cancel_requested", 1, f"user:{anna.id}"),
                                      ("cancel_requested", "completed", 1, "worker:w1")]
    assert stored_events(bare_stack, job) == 3
    assert bare_stack.job_row(job)["lease_event_at"] is None


def test_a_lease_taken_under_another_actor_is_stored_as_it_was(bare_stack: Stack, client):
    """The row holds a lease only for the process the transaction's actor names: a claim made
    under another name (an operator's tool, a test) keeps its own actor in a stored event."""
    _, anna, job = queued_job(bare_stack, client)
    leased = lease(bare_stack, job, "w1", actor="cli")
    complete(bare_stack, leased, "w1")
    assert moves(bare_stack, job) == [(None, "queued", 0, f"user:{anna.id}"),
                                      ("queued", "leased", 1, "cli"),
                                      ("leased", "completed", 1, "worker:w1")]
    assert stored_events(bare_stack, job) == 2


def test_an_expired_lease_taken_over_in_place_stores_the_new_attempt(bare_stack: Stack, client):
    """A move that changes the attempt and not the status (an expired lease taken over in
    place, which the transition trigger allows whoever writes it) is stored, as every move the
    row does not hold."""
    _, anna, job = queued_job(bare_stack, client)
    lease(bare_stack, job, "w1", actor="cli")
    expire_lease(bare_stack, uuid.UUID(job))
    with bare_stack.admin() as conn:
        conn.execute(text("SELECT set_config('app.actor', 'worker:w2', true)"))
        conn.execute(text("UPDATE jobs SET lease_token = gen_random_uuid(), leased_by = 'w2',"
                          " lease_until = now() + interval '30 seconds', attempts = attempts + 1"
                          " WHERE id = :id"), {"id": job})
    assert moves(bare_stack, job) == [(None, "queued", 0, f"user:{anna.id}"),
                                      ("queued", "leased", 1, "cli"),
                                      ("leased", "leased", 2, "worker:w2")]
    assert stored_events(bare_stack, job) == 2


def test_a_birth_by_someone_other_than_the_requester_names_them(bare_stack: Stack, client):
    """An operator's retry is the requester's job, submitted by the operator: its row keeps who
    submitted it, and so does its history's birth."""
    made = operator_retry(bare_stack, client)
    row = bare_stack.job_row(made.retry)
    assert (row["requested_by"], row["submitted_as"]) == (made.requester.id,
                                                          f"operator:{made.operator.id}")
    assert [(e["from_status"], e["to_status"], e["actor"])
            for e in bare_stack.events(made.retry)] == [(None, "queued", f"operator:{made.operator.id}")]
    assert stored_events(bare_stack, made.retry) == 0


def test_the_history_of_another_organizations_job_is_empty_for_the_web(bare_stack: Stack, client):
    """Attack: scoped to its own organization, the web role asks for another's job's history."""
    org, other = bare_stack.org(), bare_stack.org()
    anna = bare_stack.user(org, role="owner")
    job = submit(client, org, anna, "bench.noop")["id"]
    with transaction(bare_stack.app_db, organization_id=other) as conn:
        seen = conn.execute(text("SELECT count(*) FROM job_history WHERE job_id = :id"),
                            {"id": job}).scalar_one()
    with transaction(bare_stack.app_db, organization_id=org) as conn:
        own = conn.execute(text("SELECT count(*) FROM job_history WHERE job_id = :id"),
                           {"id": job}).scalar_one()
    assert (seen, own) == (0, 1)


def test_the_lease_and_completion_a_row_holds_are_read_only_in_its_organization(
        bare_stack: Stack, client):
    """Attack: the worker reads every organization's jobs, but the history's lease and
    completion read from a row are, like its events, its scoped organization's only; the web
    scoped to another organization reads none of them either."""
    org, _, job = queued_job(bare_stack, client)
    other = bare_stack.org()
    complete(bare_stack, lease(bare_stack, job, "w1"), "w1")
    assert stored_events(bare_stack, job) == 0
    query = text("SELECT to_status FROM job_history WHERE job_id = :id ORDER BY id")
    seen = {}
    for name, db, scope in (("worker, unscoped", bare_stack.worker_db, None),
                            ("worker, another", bare_stack.worker_db, other),
                            ("web, another", bare_stack.app_db, other),
                            ("worker, its own", bare_stack.worker_db, org)):
        with transaction(db, organization_id=scope) as conn:
            seen[name] = conn.execute(query, {"id": job}).scalars().all()
    assert seen == {"worker, unscoped": [], "worker, another": [], "web, another": [],
                    "worker, its own": ["queued", "leased", "completed"]}
