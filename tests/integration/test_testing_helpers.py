"""spacejobs.testing against a real PostgreSQL: the harness an application's tests use runs due
jobs in the test's process through the real engine (no Celery worker, no Redis), sees what was
submitted as the owner or as a scoped web connection, and moves time for timers, retries and
signal timeouts. Each helper has a test that fails if it breaks."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import text

from spacejobs import testing
from spacejobs.models.errors import SignalTimeout
from spacejobs.models.jobs.records import Status
from spacejobs.models.kinds import RateLimit
from spacejobs.models.tenancy import accounts
from spacejobs.testing import AttemptOutcome as Outcome
from spacejobs.testing import Harness, Member
from tests.kit.stack import Stack


@pytest.fixture(scope="module")
def harness(bare_stack: Stack) -> Iterator[Harness]:
    with Harness(bare_stack.admin_url, results=bare_stack.results()) as made:
        yield made


@pytest.fixture()
def member(harness: Harness) -> Member:
    """A member of a new organization: each test's jobs are its own."""
    return harness.member()


def submit(harness: Harness, member: Member, kind: str, params: dict[str, Any] | None = None,
           **options: Any) -> UUID:
    """As the application does: the job API as the web role, in a transaction of its own."""
    return harness.jobs.enqueue(kind, params, organization_id=member.organization_id,
                                requested_by=member.user_id, **options).job.id


def projects(stack: Stack, org: UUID) -> int:
    with stack.admin() as conn:
        return conn.execute(text("SELECT count(*) FROM projects WHERE organization_id = :o"),
                            {"o": org}).scalar_one()


# -- running jobs through the real engine ------------------------------------------------------

def test_run_job_runs_that_job_through_the_worker_role_and_nothing_else(
        harness: Harness, member: Member, bare_stack: Stack):
    other = harness.member()
    # Older, so a claim would take them first: the same organization's, and another's.
    bystanders = [submit(harness, member, "test.echo", {"data": "not now"}),
                  submit(harness, other, "test.echo", {"data": "not now"})]
    job = submit(harness, member, "test.echo", {"data": {"answer": 42}})

    ran = harness.run_job(job)

    assert (ran.job_id, ran.kind, ran.attempt, ran.outcome) == (job, "test.echo", 1, "completed")
    assert ran.result == {"data": {"answer": 42}}
    row = bare_stack.job_row(job)
    assert (row["status"], row["result"]) == ("completed", ran.result)
    assert [(e["to_status"], e["actor"]) for e in bare_stack.events(job)][1:] == [
        ("leased", f"worker:{harness.worker}"), ("completed", f"worker:{harness.worker}")]
    assert [harness.job(b).status for b in bystanders] == [Status.QUEUED] * 2
    assert harness.run_job(bystanders[1]).outcome == Outcome.COMPLETED
    assert harness.job(bystanders[0]).status == Status.QUEUED


def test_drain_runs_only_the_organization_or_the_kinds_it_is_given(harness: Harness, member: Member):
    other = harness.member()
    mine = [submit(harness, member, "test.echo", {"data": n}) for n in range(3)]
    theirs = submit(harness, other, "test.echo", {"data": "theirs"})
    capped = submit(harness, member, "test.capped")

    echoes = harness.drain(organization_id=member.organization_id, kinds={"test.echo"})
    assert sorted(str(r.job_id) for r in echoes) == sorted(str(j) for j in mine)
    assert echoes.outcomes() == [("test.echo", "completed")] * 3
    assert harness.job(theirs).status == harness.job(capped).status == Status.QUEUED

    rest = harness.drain(organization_id=member.organization_id)
    assert [r.job_id for r in rest] == [capped]
    assert harness.job(theirs).status == Status.QUEUED
    assert [r.job_id for r in harness.drain(organization_id=other.organization_id)] == [theirs]


def test_a_sleeping_job_ends_its_run_waiting_and_is_resumed_only_once_time_is_moved(
        harness: Harness, member: Member, bare_stack: Stack):
    job = submit(harness, member, "test.step_then_sleep", {"project": "Apollo", "seconds": 30})

    (ran,) = harness.drain(organization_id=member.organization_id)
    assert (ran.outcome, ran.waits_for) == ("waiting", "moment")
    assert harness.job(job).status == Status.WAITING
    assert harness.drain(organization_id=member.organization_id) == []
    with pytest.raises(testing.NotDue, match="waits for its moment"):
        harness.run_job(job)

    harness.advance(25)
    assert harness.drain(organization_id=member.organization_id) == []  # 5 s are left
    assert harness.advance(6) == [job]
    (ran,) = harness.drain(organization_id=member.organization_id)
    assert ran.outcome == Outcome.COMPLETED and ran.result["attempt"] == 1
    assert projects(bare_stack, member.organization_id) == 1  # the step ran once, not per run


def test_with_timers_the_drain_moves_time_itself(harness: Harness, member: Member):
    job = submit(harness, member, "test.step_then_sleep", {"project": "Gemini", "seconds": 30})
    drained = harness.drain(organization_id=member.organization_id, with_timers=True)
    assert drained.outcomes() == [("test.step_then_sleep", "waiting"),
                                  ("test.step_then_sleep", "completed")]
    assert harness.job(job).status == Status.COMPLETED


def test_a_signal_wait_ends_waiting_and_the_signal_puts_it_back(harness: Harness, member: Member):
    admin = harness.member("admin", organization_id=member.organization_id)
    job = submit(harness, member, "test.approval", {"timeout": 3600})

    ran = harness.run_job(job)
    assert (ran.outcome, ran.waits_for) == ("waiting", "signal")
    with pytest.raises(testing.NotDue, match="'approve'"):
        harness.run_job(job)

    assert harness.signal(job, "approve", {"by": "me"}, sender=admin) == Status.QUEUED
    (ran,) = harness.drain(organization_id=member.organization_id)
    assert ran.result == {"payload": {"by": "me"}, "sent_by": str(admin.user_id),
                          "sender_role": "admin"}


def test_a_signal_sent_before_the_wait_is_taken_in_the_first_run(harness: Harness, member: Member):
    job = submit(harness, member, "test.approval", {"timeout": 3600})
    assert harness.signal(job, "approve", "early") == Status.QUEUED
    ran = harness.run_job(job)
    assert ran.outcome == Outcome.COMPLETED
    assert (ran.result["payload"], ran.result["sender_role"]) == ("early", "member")


def test_make_due_times_a_signal_wait_out(harness: Harness, member: Member):
    job = submit(harness, member, "test.approval", {"timeout": 3600})
    assert harness.run_job(job).outcome == "waiting"
    assert harness.drain(organization_id=member.organization_id) == []
    assert harness.make_due(job) == [job]
    ran = harness.run_job(job)
    assert ran.outcome == Outcome.FAILED and isinstance(ran.error, SignalTimeout)
    assert harness.job(job).error_code == "signal_timeout"


def test_advance_brings_a_failed_attempts_backoff_forward(harness: Harness, member: Member):
    job = submit(harness, member, "test.retry_later")
    (ran,) = harness.drain(organization_id=member.organization_id)
    assert (ran.outcome, ran.error.code if ran.error else None) == ("retry", "not_yet")
    assert harness.job(job).run_after > datetime.now(UTC) + timedelta(minutes=4)
    assert harness.drain(organization_id=member.organization_id) == []

    assert harness.advance(minutes=10, organization_id=member.organization_id) == [job]
    (ran,) = harness.drain(organization_id=member.organization_id)
    assert (ran.outcome, ran.attempt, ran.result) == ("completed", 2, {"attempt": 2})


def test_advance_moves_one_organizations_time_only_when_asked(harness: Harness, member: Member):
    other = harness.member()
    mine, theirs = (submit(harness, m, "test.retry_later") for m in (member, other))
    harness.drain(organization_id=member.organization_id)
    harness.drain(organization_id=other.organization_id)
    assert harness.advance(minutes=10, organization_id=member.organization_id) == [mine]
    assert harness.job(theirs).run_after > datetime.now(UTC) + timedelta(minutes=4)
    assert harness.drain(organization_id=other.organization_id) == []


def test_advance_opens_a_full_rate_limit_window(harness: Harness, member: Member):
    with harness.owner() as conn:
        accounts.set_rate_limit(conn, member.organization_id, "test.echo", RateLimit(1, 3600))
    first, second = (submit(harness, member, "test.echo", {"data": n}) for n in (1, 2))
    assert [r.job_id for r in harness.drain(organization_id=member.organization_id)] == [first]
    assert harness.drain(organization_id=member.organization_id) == []  # the hour's one start
    harness.advance(hours=1, organization_id=member.organization_id)
    assert [r.job_id for r in harness.drain(organization_id=member.organization_id)] == [second]


def test_a_later_start_is_not_due_until_make_due(harness: Harness, member: Member):
    job = submit(harness, member, "test.echo", {"data": 1},
                 run_after=datetime.now(UTC) + timedelta(hours=2))
    with pytest.raises(testing.NotDue, match="start later"):
        harness.run_job(job)
    assert harness.make_due(job) == [job]
    assert harness.run_job(job).outcome == Outcome.COMPLETED
    row = harness.row(job)  # every column, as the owner
    assert (row["params"], row["result"]) == ({"data": 1}, {"data": 1})


def test_a_bug_in_a_kind_is_raised_after_it_was_recorded_unless_asked_not_to(
        harness: Harness, member: Member):
    job = submit(harness, member, "test.retry_later", {"bug": True})
    with pytest.raises(RuntimeError, match="a bug on the first attempt"):
        harness.drain(organization_id=member.organization_id)
    found = harness.job(job)
    assert (found.status, found.error_code, found.attempts) == ("queued", "internal_error", 1)

    other = submit(harness, member, "test.retry_later", {"bug": True})
    (ran,) = harness.drain(organization_id=member.organization_id, raise_errors=False)
    assert ran.job_id == other and ran.outcome == "retry" and isinstance(ran.error, RuntimeError)


def test_a_fan_out_runs_its_children_and_its_parent_after_them_in_one_drain(
        harness: Harness, member: Member):
    job = submit(harness, member, "test.fan", {"parts": [{"n": 2}, {"n": 3}], "max_parallel": 1})
    drained = harness.drain(organization_id=member.organization_id)
    assert drained.outcomes() == [("test.fan", "waiting"), ("test.part", "completed"),
                                  ("test.part", "completed"), ("test.fan", "completed")]
    assert drained.of(job)[-1].result == {"parts": [{"n": 2, "square": 4}, {"n": 3, "square": 9}]}
    assert [j.kind for j in harness.submitted(organization_id=member.organization_id)] == ["test.fan"]
    assert len(harness.submitted(organization_id=member.organization_id,
                                 include_children=True)) == 3


# -- what was submitted ------------------------------------------------------------------------

def test_submitted_sees_what_the_app_submitted_and_not_another_organizations(
        harness: Harness, member: Member):
    other = harness.member()
    mine = submit(harness, member, "test.echo", {"data": {"invoice": "INV-1", "cents": 500}})
    submit(harness, other, "test.echo", {"data": {"invoice": "INV-2"}})

    # As the owner: every organization's jobs unless one is named.
    assert [j.id for j in harness.submitted("test.echo", organization_id=member.organization_id)] == [mine]
    assert len(harness.submitted("test.echo")) >= 2
    found = harness.assert_submitted("test.echo", params={"data": {"invoice": "INV-1"}},
                                     organization_id=member.organization_id, status="queued")
    assert found.id == mine
    harness.refute_submitted("test.echo", params={"data": {"invoice": "INV-2"}},
                             organization_id=member.organization_id)

    # As the web role, scoped to the member's organization: row-level security shows only its own.
    with harness.jobs.transaction(member.organization_id, member.user_id) as (conn, _member):
        assert [j.id for j in testing.submitted(conn, "test.echo")] == [mine]
        assert testing.assert_submitted(conn, "test.echo", count=1).id == mine
        testing.refute_submitted(conn, params={"data": {"invoice": "INV-2"}})


def test_assert_submitted_fails_saying_what_was_submitted(harness: Harness, member: Member):
    submit(harness, member, "test.echo", {"data": "x"})
    with pytest.raises(AssertionError, match=r"(?s)expected a job of kind test.capped.*test.echo queued"):
        harness.assert_submitted("test.capped", organization_id=member.organization_id)
    with pytest.raises(AssertionError, match="expected 2 jobs"):
        harness.assert_submitted("test.echo", organization_id=member.organization_id, count=2)
    with pytest.raises(AssertionError, match=r"expected no job of kind test\.echo"):
        harness.refute_submitted("test.echo", organization_id=member.organization_id)
