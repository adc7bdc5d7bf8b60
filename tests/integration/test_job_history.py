"""A job's history (job_history): its birth read from its row, then its stored events.

A submit writes no event row for the birth (bench.cost counts the WAL that saves); the history
reads the same all the same: who asked, as whom, and when."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from spacejobs.models.db.transaction import transaction
from tests.conftest import operator_retry, submit
from tests.integration.leasing import claim_one, complete_one
from tests.kit.stack import Stack


@pytest.fixture(scope="module")
def client(bare_stack: Stack) -> Any:
    # No worker reads the queue: the wake-ups go to a broker nobody listens to.
    return bare_stack.make_app(BROKER_URL="redis://127.0.0.1:1/0").test_client()


def stored_events(stack: Stack, job_id: object) -> int:
    with stack.admin() as conn:
        return conn.execute(text("SELECT count(*) FROM job_events WHERE job_id = :id"),
                            {"id": job_id}).scalar_one()


def test_a_submit_stores_no_birth_event_and_its_history_begins_with_it(bare_stack: Stack, client):
    org = bare_stack.org()
    anna = bare_stack.user(org, role="owner")
    job = submit(client, org, anna, "bench.noop")["id"]
    row = bare_stack.job_row(job)
    assert stored_events(bare_stack, job) == 0
    assert bare_stack.events(job) == [{"from_status": None, "to_status": "queued", "attempt": 0,
                                       "actor": f"user:{anna.id}", "at": row["created_at"]}]
    assert row["submitted_as"] is None

    with transaction(bare_stack.worker_db, actor="worker:w1") as conn:
        leased = claim_one(conn, "w1")
        while leased is not None and str(leased.id) != job:
            complete_one(conn, leased.id, leased.lease_token, {})
            leased = claim_one(conn, "w1")
        assert leased is not None
        complete_one(conn, leased.id, leased.lease_token, {})
    history = bare_stack.events(job)
    assert [(e["from_status"], e["to_status"], e["actor"]) for e in history] == [
        (None, "queued", f"user:{anna.id}"), ("queued", "leased", "worker:w1"),
        ("leased", "completed", "worker:w1")]
    assert history[0]["at"] <= history[1]["at"] <= history[2]["at"]
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
