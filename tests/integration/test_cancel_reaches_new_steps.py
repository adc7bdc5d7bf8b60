"""A parent's cancel racing what makes its children (the lease holder starting its fan-out, a
child's end releasing the next one through the jobs trigger): whichever comes first, no child
may start once the cancel has taken effect (``python -m bench.chaos`` judges the same from the
events: "no step starts after its workflow's cancel"). The interleavings are forced with two
transactions against the real schema, as the real roles (no worker processes)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.jobs.records import LeasedJob
from spacejobs.models.kinds import get_any_kind, get_kind
from tests.integration.leasing import claim_one, complete_one
from tests.kit.stack import Stack


@pytest.fixture(scope="module")
def stack_db(bare_stack: Stack) -> Stack:
    return bare_stack


def claim(stack: Stack, worker: str) -> LeasedJob | None:
    with transaction(stack.worker_db, actor=f"worker:{worker}") as conn:
        return claim_one(conn, worker)


def drain_queue(stack: Stack) -> None:
    while (leased := claim(stack, "drain")) is not None:
        with transaction(stack.worker_db) as conn:
            complete_one(conn, leased.id, leased.lease_token, {})


def leased_parent(stack: Stack) -> tuple[uuid.UUID, uuid.UUID, LeasedJob]:
    drain_queue(stack)
    org = stack.org()
    user = stack.user(org, role="owner")
    with transaction(stack.app_db, organization_id=org, user_id=user.id, actor="test") as conn:
        job, _ = store.submit(conn, [store.NewJob(get_kind("test.fan").rules, {"parts": [{"n": 0}]})],
                              organization_id=org, requested_by=user.id)[0]
    parent = claim(stack, "parent")
    assert parent is not None and parent.id == job.id
    return org, user.id, parent


class Beside(threading.Thread):
    """``fn`` in a thread of its own, keeping its answer or its error."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.fn = fn
        self.answer: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.answer = self.fn()
        except BaseException as exc:
            self.error = exc

    def result(self, timeout: float = 30) -> Any:
        self.join(timeout)
        assert not self.is_alive(), "still blocked"
        if self.error is not None:
            raise self.error
        return self.answer


def children_statuses(stack: Stack, parent_id: uuid.UUID) -> list[str]:
    with stack.admin() as conn:
        return list(conn.execute(text("SELECT status FROM jobs WHERE parent_id = :p"
                                      " ORDER BY child_index"), {"p": parent_id}).scalars())


def no_step_starts(stack: Stack, parent: LeasedJob) -> None:
    started = claim(stack, "other")
    assert started is None, (
        f"a step started after its parent's cancel took effect (the parent "
        f"{stack.job_row(parent.id)['status']}, the step's events "
        f"{[e['to_status'] for e in stack.events(started.id)]})")


def test_a_cancel_while_the_fan_out_starts_cancels_its_first_children_too(stack_db: Stack):
    org, user, parent = leased_parent(stack_db)
    part = get_any_kind("test.part").rules

    def cancel() -> str:
        with transaction(stack_db.app_db, organization_id=org, user_id=user) as conn:
            return str(store.request_cancel(conn, parent.id, user).status)

    # The lease holder is starting its fan-out; the requester's cancel comes before that commits.
    with transaction(stack_db.worker_db, actor="worker:parent") as starting:
        state = store.start_fan_out(starting, parent, part, [{"n": 0}, {"n": 1}], max_parallel=2)
        assert state == store.FanOut(total=2, released=2, ended=0)
        canceller = Beside(cancel)
        canceller.start()
        canceller.join(1.0)  # it waits for the start's commit (or has wrongly gone ahead)
    assert canceller.result() == "cancel_requested"
    no_step_starts(stack_db, parent)
    assert children_statuses(stack_db, parent.id) == ["cancelled", "cancelled"]


def test_a_fan_out_started_after_the_cancel_began_makes_nothing(stack_db: Stack):
    org, user, parent = leased_parent(stack_db)
    part = get_any_kind("test.part").rules

    def start() -> store.FanOut | None:
        with transaction(stack_db.worker_db, actor="worker:parent") as conn:
            return store.start_fan_out(conn, parent, part, [{"n": 0}], max_parallel=1)

    # The requester's cancel has changed the parent but not committed yet when the lease holder
    # starts its fan-out.
    with transaction(stack_db.app_db, organization_id=org, user_id=user) as conn:
        assert store.request_cancel(conn, parent.id, user).status == "cancel_requested"
        starter = Beside(start)
        starter.start()
        starter.join(1.0)  # it waits for the cancel's commit (or has wrongly gone ahead)
    assert starter.result() is None
    no_step_starts(stack_db, parent)
    assert children_statuses(stack_db, parent.id) == []


def waiting_fan_out(stack: Stack, items: int, max_parallel: int
                    ) -> tuple[uuid.UUID, uuid.UUID, LeasedJob]:
    """A parent whose fan-out has started and that waits for it, as its first run leaves it."""
    org, user, parent = leased_parent(stack)
    with transaction(stack.worker_db, actor="worker:parent") as conn:
        store.start_fan_out(conn, parent, get_any_kind("test.part").rules,
                            [{"n": n} for n in range(items)], max_parallel=max_parallel)
        assert store.wait_job(conn, parent.id, parent.lease_token, until=None, signal=None,
                              children=1) == "waiting"
    return org, user, parent


def test_a_cancel_while_a_childs_end_releases_the_next_cancels_that_one_too(stack_db: Stack):
    org, user, parent = waiting_fan_out(stack_db, items=2, max_parallel=1)
    first = claim(stack_db, "child")
    assert first is not None and children_statuses(stack_db, parent.id) == ["leased"]

    def cancel() -> str:
        with transaction(stack_db.app_db, organization_id=org, user_id=user) as conn:
            return str(store.request_cancel(conn, parent.id, user).status)

    # The first child's finish releases the second (the jobs trigger, holding the parent's
    # row); the requester's cancel comes before that commits.
    with transaction(stack_db.worker_db, actor="worker:child") as finishing:
        assert complete_one(finishing, first.id, first.lease_token, {"n": 0})
        canceller = Beside(cancel)
        canceller.start()
        canceller.join(1.0)  # it waits for the finish's commit (or has wrongly gone ahead)
    assert canceller.result() == "cancelled"  # the parent was waiting: cancelled at once
    no_step_starts(stack_db, parent)
    assert children_statuses(stack_db, parent.id) == ["completed", "cancelled"]


def test_a_cancel_and_a_childs_finish_at_the_same_moment_do_not_deadlock(stack_db: Stack):
    org, user, parent = waiting_fan_out(stack_db, items=1, max_parallel=1)
    child = claim(stack_db, "child")
    assert child is not None

    def finish() -> bool:
        # The child's row, then (the jobs trigger, for a parent waiting on it) its parent's.
        with transaction(stack_db.worker_db, actor="worker:child") as conn:
            return complete_one(conn, child.id, child.lease_token, {"n": 0})

    # The cancel has taken its locks when the child's finish comes: the finish waits for the
    # cancel as a whole, rather than holding the child while the cancel waits for it.
    with transaction(stack_db.app_db, organization_id=org, user_id=user) as conn:
        conn.execute(store.Q["lock_for_cancel"], {"id": str(parent.id)})
        finisher = Beside(finish)
        finisher.start()
        finisher.join(0.5)
        assert store.request_cancel(conn, parent.id, user).status == "cancelled"
    # The cancel came first and asked the running child to stop; its finish, which waited,
    # still wins (cancel_requested -> completed).
    assert finisher.result() is True
    assert children_statuses(stack_db, parent.id) == ["completed"]
