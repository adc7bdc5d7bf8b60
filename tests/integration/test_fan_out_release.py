"""The fan-outs and workflows the database runs (models/db/schema/70_fan_out.sql), driven by
hand as the worker role, no worker processes. A fan-out's start releases the first max_parallel
children, each child's end releases the next in its own transaction, never more than
max_parallel unfinished, the parent resumed only once the last has ended, a second start
changes nothing, a cancelled parent releases nothing more, and children made before the fan-out
count as its first places. A workflow's step end makes the steps it lets go, with its result as
their input; fail_fast resumes the workflow at the first failure and makes nothing more; run_all
never makes a step whose dependency failed."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from sqlalchemy import text

from spacejobs.models.db.transaction import transaction
from spacejobs.models.errors import LeaseLost
from spacejobs.models.jobs import store
from spacejobs.models.jobs.records import LeasedJob
from spacejobs.models.kinds import get_any_kind, get_kind, load_kinds
from tests.kit.stack import Stack

load_kinds()
PART = get_any_kind("test.part").rules
ACTIVE = ("queued", "leased", "cancel_requested", "waiting")


@pytest.fixture(scope="module")
def db(bare_stack: Stack) -> Stack:
    return bare_stack


def leased_parent(stack: Stack) -> LeasedJob:
    """A parent (kind test.fan, which never runs here) submitted and leased by hand."""
    org = stack.org()
    user = stack.user(org, role="owner")
    with transaction(stack.app_db, organization_id=org, user_id=user.id, actor="test") as conn:
        job, _ = store.submit(conn, [store.NewJob(get_kind("test.fan").rules, {"parts": []})],
                              organization_id=org, requested_by=user.id)[0]
    with transaction(stack.worker_db, actor="worker:w") as conn:
        leased = store.claim_batch(conn, "w", limit=10)
    mine = [j for j in leased if j.id == job.id]
    assert mine, "the parent was not claimed"
    with transaction(stack.worker_db) as conn:  # anything else claimed goes back
        store.release_batch(conn, [(j.id, j.lease_token) for j in leased if j.id != job.id])
    return mine[0]


def children(stack: Stack, parent: LeasedJob) -> list[dict]:
    with stack.admin() as conn:
        return [dict(r) for r in conn.execute(text(
            "SELECT id, child_index, status, params, organization_id, requested_by FROM jobs"
            " WHERE parent_id = :p ORDER BY child_index"), {"p": parent.id}).mappings()]


def unfinished(stack: Stack, parent: LeasedJob) -> int:
    return sum(c["status"] in ACTIVE for c in children(stack, parent))


def end_child(stack: Stack, child_id: uuid.UUID, *, fail: bool = False) -> None:
    """Lease the child by hand (as a worker would) and end it, in one finish transaction."""
    with stack.admin() as conn:
        token = conn.execute(text(
            "UPDATE jobs SET status = 'leased', lease_token = gen_random_uuid(), attempts = 1,"
            " lease_until = now() + interval '1 minute', started_at = now() WHERE id = :id"
            " RETURNING lease_token"), {"id": child_id}).scalar_one()
    with transaction(stack.worker_db, actor="worker:w") as conn:
        if fail:
            from spacejobs.models.errors import InternalJobError
            error = InternalJobError()
            error.permanent = True
            assert store.fail_attempt(conn, child_id, token, error, retry_in=0) == "failed"
        else:
            assert store.complete_batch(conn, [(child_id, token, {"ok": True}, None)])


def leased_child(stack: Stack, parent: LeasedJob, child: dict) -> LeasedJob:
    """The child leased by hand, as a worker's claim would hand it over."""
    with stack.admin() as conn:
        token = conn.execute(text(
            "UPDATE jobs SET status = 'leased', lease_token = gen_random_uuid(), attempts = 1,"
            " lease_until = now() + interval '1 minute', started_at = now() WHERE id = :id"
            " RETURNING lease_token"), {"id": child["id"]}).scalar_one()
    return dataclasses.replace(parent, id=child["id"], params=child["params"], lease_token=token,
                               attempt=1)


def parent_row(stack: Stack, parent: LeasedJob) -> dict:
    return stack.job_row(parent.id)


def test_each_end_releases_the_next_and_the_parent_goes_on_only_after_the_last(db: Stack):
    parent = leased_parent(db)
    items = [{"n": n} for n in range(5)]
    with transaction(db.worker_db) as conn:
        started = store.start_fan_out(conn, parent, PART, items, max_parallel=2)
    assert started == store.FanOut(total=5, released=2, ended=0)
    kids = children(db, parent)
    assert [(c["child_index"], c["params"], c["status"]) for c in kids] == [
        (0, {"n": 0}, "queued"), (1, {"n": 1}, "queued")]
    assert {(c["organization_id"], c["requested_by"]) for c in kids} == {
        (parent.organization_id, parent.requested_by)}
    # Another start (a later attempt, with other items) changes nothing.
    with transaction(db.worker_db) as conn:
        again = store.start_fan_out(conn, parent, PART, [{"n": 9}], max_parallel=5)
    assert again == started and len(children(db, parent)) == 2
    with transaction(db.worker_db) as conn:
        assert store.wait_job(conn, parent.id, parent.lease_token, until=None, signal=None,
                              children=1) == "waiting"
    for place in range(5):
        end_child(db, children(db, parent)[place]["id"], fail=place == 3)
        assert unfinished(db, parent) <= 2
        made = len(children(db, parent))
        assert made == min(5, place + 3)  # the end released the next, in its own transaction
        row = parent_row(db, parent)
        if place < 4:
            assert row["status"] == "waiting"
            assert row["progress"] == {"stage": "children", "done": place + 1, "total": 5}
    assert [c["params"] for c in children(db, parent)] == items  # each place once, in order
    assert parent_row(db, parent)["status"] == "queued"  # the last end resumed it
    with db.admin() as conn:
        assert conn.execute(text("SELECT count(*) FROM job_fan_out_items WHERE parent_id = :p"),
                            {"p": parent.id}).scalar_one() == 0


def test_the_state_is_for_the_lease_holder_only(db: Stack):
    parent = leased_parent(db)
    with transaction(db.worker_db) as conn:
        assert store.fan_out_state(conn, parent) is None  # not started
        stranger = LeasedJob(**{**parent.__dict__, "lease_token": uuid.uuid4()})
        with pytest.raises(LeaseLost):
            store.fan_out_state(conn, stranger)
        assert store.start_fan_out(conn, stranger, PART, [{"n": 0}], max_parallel=1) is None
    assert children(db, parent) == []


def test_a_cancelled_parent_releases_nothing_more(db: Stack):
    parent = leased_parent(db)
    with transaction(db.worker_db) as conn:
        store.start_fan_out(conn, parent, PART, [{"n": n} for n in range(4)], max_parallel=2)
        store.wait_job(conn, parent.id, parent.lease_token, until=None, signal=None, children=1)
    with db.admin() as conn:  # a user's cancel of the waiting parent, as request_cancel does
        conn.execute(text("UPDATE jobs SET status = 'cancelled' WHERE id = :p"), {"p": parent.id})
    # The cancel takes the children with it (the jobs trigger), and their ends, under a
    # cancelled parent, release nothing more.
    assert [c["status"] for c in children(db, parent)] == ["cancelled", "cancelled"]


def test_children_made_before_the_fan_out_count_as_its_first_places(db: Stack):
    """A parent that made its first children one by one (as workers did before revision 0033
    moved fan-outs into the database: the rows written here as that function wrote them) and is
    claimed again, after the upgrade, by a worker that starts a fan-out."""
    parent = leased_parent(db)
    with db.admin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (organization_id, requested_by, kind, params, max_attempts,"
            "                  lease_seconds, parent_id, child_index)"
            " SELECT p.organization_id, p.requested_by, :k, jsonb_build_object('n', n), 3, 30,"
            "        p.id, n"
            " FROM jobs p, generate_series(0, 1) AS n WHERE p.id = :p"),
            {"p": parent.id, "k": PART.name})
    end_child(db, children(db, parent)[0]["id"])
    with transaction(db.worker_db) as conn:
        state = store.start_fan_out(conn, parent, PART, [{"n": n} for n in range(4)],
                                    max_parallel=2)
    assert state == store.FanOut(total=4, released=3, ended=1)
    assert [c["params"]["n"] for c in children(db, parent)] == [0, 1, 2]


def started_workflow(stack: Stack, after: list[list[int]], policy: str = "fail_fast",
                     max_parallel: int | None = None) -> LeasedJob:
    parent = leased_parent(stack)
    noop = get_kind("bench.noop").rules
    plan = [store.StepPlan(noop, {"step": place}, deps) for place, deps in enumerate(after)]
    with transaction(stack.worker_db) as conn:
        state = store.start_workflow(conn, parent, plan, policy, max_parallel)
        assert state is not None
        assert store.wait_job(conn, parent.id, parent.lease_token, until=None, signal=None,
                              children=state.active) == "waiting"
    return parent


def test_a_steps_end_makes_the_next_step_which_reads_its_result_when_it_runs(db: Stack):
    parent = started_workflow(db, [[], [0], [1]])  # a chain of three
    assert [c["child_index"] for c in children(db, parent)] == [0]
    end_child(db, children(db, parent)[0]["id"])
    kids = children(db, parent)
    # The next step names its dependency's place, never a copy of its result (revision 0042).
    assert [(c["child_index"], c["params"]) for c in kids] == [
        (0, {"step": 0, "_after": []}), (1, {"step": 1, "_after": [0]})]
    step = leased_child(db, parent, kids[1])
    with transaction(db.worker_db) as conn:
        assert store.step_inputs(conn, step) == [{"ok": True}]
        with pytest.raises(LeaseLost):  # a stranger's token reads nothing
            store.step_inputs(conn, dataclasses.replace(step, lease_token=uuid.uuid4()))
    with transaction(db.worker_db) as conn:
        store.release_batch(conn, [(step.id, step.lease_token)])
    assert parent_row(db, parent)["status"] == "waiting"  # not settled: no run in between
    end_child(db, kids[1]["id"])
    end_child(db, children(db, parent)[2]["id"])
    assert parent_row(db, parent)["status"] == "queued"  # settled: it goes on to collect


def test_a_failed_step_under_fail_fast_resumes_the_workflow_and_makes_nothing_more(db: Stack):
    parent = started_workflow(db, [[], [], [0, 1]])
    first, second = children(db, parent)
    end_child(db, first["id"], fail=True)
    assert parent_row(db, parent)["status"] == "queued"  # at once, the other step still queued
    end_child(db, second["id"])
    assert [c["child_index"] for c in children(db, parent)] == [0, 1]  # the third never made


def test_under_run_all_a_step_whose_dependency_failed_is_never_made(db: Stack):
    parent = started_workflow(db, [[], [], [0]], policy="run_all")
    first, second = children(db, parent)
    end_child(db, first["id"], fail=True)
    assert parent_row(db, parent)["status"] == "waiting"  # the second still runs
    end_child(db, second["id"])
    assert parent_row(db, parent)["status"] == "queued"
    assert [c["child_index"] for c in children(db, parent)] == [0, 1]


def test_a_workflow_with_max_parallel_makes_its_ready_steps_as_room_comes(db: Stack):
    parent = started_workflow(db, [[], [], [], [0]], max_parallel=2)
    assert [c["child_index"] for c in children(db, parent)] == [0, 1]
    end_child(db, children(db, parent)[1]["id"])  # room for one: the next ready step, 2
    assert [c["child_index"] for c in children(db, parent)] == [0, 1, 2]
    end_child(db, children(db, parent)[0]["id"])  # 3 is ready now, and there is room
    assert [c["child_index"] for c in children(db, parent)] == [0, 1, 2, 3]
    assert unfinished(db, parent) == 2


def test_a_child_is_dated_when_it_is_made_not_when_its_transaction_began(db: Stack):
    """A child's created_at is its birth in job_history, and the chaos run's cancel invariant
    dates a step made after its workflow's cancel by it: the statements that make children
    stamp the moment they run (clock_timestamp()), not their transaction's start (now())."""
    fan_parent = leased_parent(db)
    flow_parent = leased_parent(db)
    noop = get_kind("bench.noop").rules
    for start in ("fan_out", "workflow"):
        with transaction(db.worker_db) as conn:
            began = conn.execute(text("SELECT now()")).scalar_one()
            conn.execute(text("SELECT pg_sleep(0.3)"))
            if start == "fan_out":
                parent = fan_parent
                assert store.start_fan_out(conn, parent, PART, [{"n": 0}], max_parallel=1)
            else:
                parent = flow_parent
                assert store.start_workflow(conn, parent, [store.StepPlan(noop, {}, [])],
                                            "fail_fast")
        (child,) = children(db, parent)
        born = db.job_row(child["id"])["created_at"]
        assert (born - began).total_seconds() >= 0.3, start
