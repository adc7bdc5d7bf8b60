"""What a job's organization and requester, and an audit entry's organization, must name (the
foreign keys of jobs and org_audit), as the owner role, whose administrative sessions are held
to them too; and what deleting an organization or a user does to the rows that name it, with a
deletion racing a write. The keys cost a bulk submit a fifth of its time (docs/history/benchmarks.md);
whatever replaces them must still pass these."""

from __future__ import annotations

import threading
import uuid

import pytest
from psycopg import errors
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from spacejobs.models.jobs.service import Jobs
from tests.kit.stack import Stack

INSERT_JOB = ("INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds, max_attempts)"
              " VALUES (:org, :user, 'bench.noop', 30, 3)")


def owner_refuses(stack: Stack, statement: str, **params: object) -> None:
    with pytest.raises(IntegrityError) as refused, stack.admin() as conn:
        conn.execute(text(statement), params)
    assert isinstance(refused.value.orig, errors.ForeignKeyViolation)


def test_a_job_naming_a_missing_organization_or_requester_is_refused(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    owner_refuses(stack, INSERT_JOB, org=uuid.uuid4(), user=anna.id)
    owner_refuses(stack, INSERT_JOB, org=org, user=uuid.uuid4())
    # One bad row among good ones: the whole statement goes.
    owner_refuses(stack, "INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds,"
                         " max_attempts) SELECT o, :user, 'bench.noop', 30, 3"
                         " FROM unnest(ARRAY[CAST(:org AS uuid), CAST(:org AS uuid), :missing]) AS o",
                  org=org, user=anna.id, missing=uuid.uuid4())
    assert stack.count_jobs(org) == 0
    with stack.admin() as conn:
        conn.execute(text(INSERT_JOB), {"org": org, "user": anna.id})
    assert stack.count_jobs(org) == 1


def test_a_changed_requester_or_an_audit_entry_must_name_what_exists(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    with stack.admin() as conn:
        # a debounced job, queued and never started: the one whose requester may change
        conn.execute(text("INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds,"
                          " max_attempts, dedup_key, debounce_seconds)"
                          " VALUES (:org, :user, 'bench.noop', 30, 3, 'sync', 5)"),
                     {"org": org, "user": anna.id})
    bob = stack.user(org, role="member")
    owner_refuses(stack, "UPDATE jobs SET requested_by = :user WHERE organization_id = :org",
                  org=org, user=uuid.uuid4())
    with stack.admin() as conn:
        conn.execute(text("UPDATE jobs SET requested_by = :user WHERE organization_id = :org"),
                     {"org": org, "user": bob.id})
    owner_refuses(stack, "INSERT INTO org_audit (organization_id, actor, action)"
                         " VALUES (:org, 'test', 'job.submit')", org=uuid.uuid4())
    owner_refuses(stack, "UPDATE organizations SET id = :new WHERE id = :org",
                  org=org, new=uuid.uuid4())
    owner_refuses(stack, "UPDATE users SET id = :new WHERE id = :user",
                  user=anna.id, new=uuid.uuid4())


def test_a_requester_is_not_deleted_while_their_jobs_remain(bare_stack: Stack):
    # (An organization's deletion taking its jobs, their events and its log along is in
    # test_quotas.py, test_retention.py and test_org_audit.py.)
    stack = bare_stack
    org = stack.org()
    anna, bob = stack.user(org, role="owner"), stack.user(org, role="member")
    Jobs(stack.app_db).enqueue("bench.noop", organization_id=org, requested_by=bob.id)
    owner_refuses(stack, "DELETE FROM users WHERE id = :id", id=bob.id)
    with stack.admin() as conn:
        conn.execute(text("DELETE FROM users WHERE id = :id"), {"id": anna.id})
    assert stack.count_jobs(org) == 1


def _held(stack: Stack, statement: str, params: dict[str, object], done: threading.Event,
          release: threading.Event, outcome: list[object]) -> None:
    """``statement`` as the owner in a transaction that commits only when told to."""
    try:
        with stack.admin() as conn:
            conn.execute(text(statement), params)
            done.set()
            release.wait(30)
        outcome.append("committed")
    except Exception as error:  # what the other side of the race saw
        outcome.append(error)
    finally:
        done.set()


def _race(stack: Stack, first: tuple[str, dict[str, object]],
          second: tuple[str, dict[str, object]]) -> tuple[list[object], list[object]]:
    """``first`` runs and holds its transaction open; ``second`` must wait for it, and runs
    once ``first`` has committed."""
    first_done, first_release, first_outcome = threading.Event(), threading.Event(), []
    second_done, second_release, second_outcome = threading.Event(), threading.Event(), []
    second_release.set()
    holder = threading.Thread(target=_held, args=(stack, *first, first_done, first_release,
                                                  first_outcome))
    holder.start()
    assert first_done.wait(30) and first_outcome == []
    waiter = threading.Thread(target=_held, args=(stack, *second, second_done, second_release,
                                                  second_outcome))
    waiter.start()
    assert not second_done.wait(1.0)  # it waits on the first's row lock
    first_release.set()
    holder.join(30)
    waiter.join(30)
    return first_outcome, second_outcome


def test_a_job_in_flight_holds_off_its_organizations_deletion_which_then_takes_it(
        bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    inserted, deleted = _race(stack, (INSERT_JOB, {"org": org, "user": anna.id}),
                              ("DELETE FROM organizations WHERE id = :org", {"org": org}))
    # No job is left naming an organization that no longer exists.
    assert inserted == ["committed"] and deleted == ["committed"]
    assert stack.count_jobs(org) == 0


def test_a_job_for_an_organization_being_deleted_waits_and_is_refused(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    deleted, inserted = _race(stack, ("DELETE FROM organizations WHERE id = :org", {"org": org}),
                              (INSERT_JOB, {"org": org, "user": anna.id}))
    assert deleted == ["committed"]
    assert len(inserted) == 1 and isinstance(inserted[0], IntegrityError)
    assert isinstance(inserted[0].orig, errors.ForeignKeyViolation)
    assert stack.count_jobs(org) == 0
