"""Durable fan-out with real worker processes: results in input order, failures listed once
every child has ended, cancellation reaching the children, and a worker killed half-way."""

from __future__ import annotations

import itertools
import threading
import time

from sqlalchemy import text

from tests.conftest import submit
from tests.kit.stack import Stack, wait_until


def children(stack: Stack, parent: str) -> list[dict]:
    with stack.admin() as conn:
        return [dict(r) for r in conn.execute(text(
            "SELECT child_index, status, error_code, organization_id, requested_by FROM jobs"
            " WHERE parent_id = :p ORDER BY child_index"), {"p": parent}).mappings()]


def test_a_report_is_a_chord_one_step_per_project_then_a_merge_in_project_order(stack: Stack,
                                                                                 client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    names = [f"project {i}" for i in range(5)]
    for name in names:
        assert client.post(f"/api/v1/orgs/{org}/projects", headers=anna.auth,
                           json={"name": name, "description": "one two three"}).status_code == 201
    job = submit(client, org, anna, "projects_report", {"max_parallel": 2})
    done = stack.wait_for(job["id"], "completed", timeout=60)
    assert [p["name"] for p in done["result"]["projects"]] == names
    assert all(p["description_words"] == 3 for p in done["result"]["projects"])
    assert (done["result"]["count"], done["result"]["description_words"]) == (5, 15)
    kids = children(stack, job["id"])
    assert [c["child_index"] for c in kids] == list(range(6))
    with stack.admin() as conn:
        kinds = conn.execute(text("SELECT kind FROM jobs WHERE parent_id = :p ORDER BY child_index"),
                             {"p": job["id"]}).scalars().all()
        merge_started = conn.execute(text(
            "SELECT min(e.at) FROM job_history e JOIN jobs c ON c.id = e.job_id"
            " WHERE c.parent_id = :p AND c.kind = 'projects_report.merge'"
            " AND e.to_status = 'leased'"), {"p": job["id"]}).scalar_one()
        parts_ended = conn.execute(text(
            "SELECT max(c.finished_at) FROM jobs c"
            " WHERE c.parent_id = :p AND c.kind = 'projects_report.project'"),
            {"p": job["id"]}).scalar_one()
        births = conn.execute(text(
            "SELECT h.actor, h.at >= p.started_at FROM jobs c JOIN jobs p ON p.id = c.parent_id"
            " JOIN job_history h ON h.job_id = c.id AND h.from_status IS NULL"
            " WHERE c.parent_id = :p ORDER BY c.child_index"), {"p": job["id"]}).all()
    assert kinds == ["projects_report.project"] * 5 + ["projects_report.merge"]
    assert merge_started >= parts_ended  # the chord's callback runs after every part ended
    # Each child's birth, read from its row: made by a worker (its parent's lease, or a
    # sibling's finish), once the parent had started.
    assert len(births) == 6
    assert all(actor.startswith("worker:") and after_start for actor, after_start in births)
    # Children belong to the parent's organization and requester, taken from its row.
    assert {(c["organization_id"], c["requested_by"]) for c in kids} == {(org, anna.id)}
    assert done["progress"] == {"stage": "steps", "done": 6, "total": 6}


def test_a_report_runs_at_most_max_parallel_of_its_parts_at_a_time(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    for n in range(4):
        assert client.post(f"/api/v1/orgs/{org}/projects", headers=anna.auth,
                           json={"name": f"p{n}"}).status_code == 201
    job = submit(client, org, anna, "projects_report", {"max_parallel": 1})
    stack.wait_for(job["id"], "completed", timeout=60)
    with stack.admin() as conn:
        spans = conn.execute(text(
            "SELECT min(e.at) FILTER (WHERE e.to_status = 'leased') AS began, c.finished_at"
            " FROM jobs c JOIN job_history e ON e.job_id = c.id WHERE c.parent_id = :p"
            " GROUP BY c.id, c.finished_at ORDER BY began"), {"p": job["id"]}).all()
    # One at a time: each step began only after the one before it had finished.
    assert all(later.began >= earlier.finished_at for earlier, later in itertools.pairwise(spans))


def test_the_parent_fails_once_every_child_ended_listing_each_failure(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    parts = [{"n": 0}, {"n": 1, "fail": True}, {"n": 2, "seconds": 1.0}, {"n": 3, "fail": True}]
    job = submit(client, org, anna, "test.fan", {"parts": parts, "max_parallel": 4})
    failed = stack.wait_for(job["id"], "failed", timeout=60)
    assert failed["error_code"] == "children_failed"
    assert failed["error_message"] == (
        "2 of 4 parts did not complete: #2 failed (part_refused); #4 failed (part_refused)")
    # Every child had ended before the parent failed: the slow one too.
    assert [c["status"] for c in children(stack, job["id"])] == [
        "completed", "failed", "completed", "failed"]


def test_never_more_children_running_than_max_parallel(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    parts = [{"n": i, "seconds": 0.3} for i in range(6)]
    job = submit(client, org, anna, "test.fan", {"parts": parts, "max_parallel": 2})
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            with stack.admin() as conn:
                unfinished = conn.execute(text(
                    "SELECT count(*) FROM jobs WHERE parent_id = :p"
                    " AND status IN ('queued', 'leased', 'cancel_requested')"),
                    {"p": job["id"]}).scalar_one()
            peak[0] = max(peak[0], unfinished)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        done = stack.wait_for(job["id"], "completed", timeout=60)
    finally:
        stop.set()
        sampler.join()
    assert [p["n"] for p in done["result"]["parts"]] == list(range(6))
    assert peak[0] == 2


def test_cancelling_the_parent_cancels_its_children(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    parts = [{"n": i, "seconds": 5} for i in range(4)]
    job = submit(client, org, anna, "test.fan", {"parts": parts, "max_parallel": 2})
    wait_until(lambda: len(children(stack, job["id"])) >= 2, what="two children spawned")
    stack.wait_for(job["id"], "waiting")  # the parent holds no worker while its children run
    answer = client.post(job["links"]["cancel"], headers=anna.auth)
    assert answer.status_code == 200 and answer.get_json()["status"] == "cancelled"  # at once
    stack.wait_for(job["id"], "cancelled", timeout=30)
    wait_until(lambda: all(c["status"] in ("cancelled", "completed")
                           for c in children(stack, job["id"])),
               what=lambda: f"every child ended ({children(stack, job['id'])})")
    assert len(children(stack, job["id"])) == 2  # nothing spawned after the cancel
    assert {c["status"] for c in children(stack, job["id"])} == {"cancelled"}


def test_a_fan_out_survives_its_worker_killed_half_way(bare_stack: Stack):
    stack = bare_stack
    stack.retire(*stack.processes)
    org = stack.org()
    anna = stack.user(org, role="owner")
    client = stack.make_app().test_client()
    first = stack.start_worker(concurrency=2)
    stack.start_beat()
    parts = [{"n": i, "seconds": 0.5} for i in range(8)]
    job = submit(client, org, anna, "test.fan", {"parts": parts, "max_parallel": 2})
    wait_until(lambda: sum(c["status"] == "completed" for c in children(stack, job["id"])) >= 2,
               timeout=30, interval=0.05, what="two children completed")
    stack.retire(first)  # SIGKILL to the whole group: parent and children die mid-way
    stack.start_worker(concurrency=2)
    done = stack.wait_for(job["id"], "completed", timeout=90)
    assert [p["n"] for p in done["result"]["parts"]] == list(range(8))
    # The parent waits while its children run, so the kill costs it an attempt only if it
    # landed in one of its short runs between waits (the children it was running are claimed
    # again after their leases run out).
    assert done["attempts"] in (1, 2)
    assert [c["child_index"] for c in children(stack, job["id"])] == list(range(8))  # once each
    stack.retire(*stack.processes)


def test_a_part_takes_only_a_uuid_for_a_project_id_and_a_bad_one_fails_its_parent_at_once(
        stack: Stack, client):
    org = stack.org()
    vera = stack.user(org, role="member")
    not_a_uuid = "MEMBER-TEXT-" + "x" * 24  # 36 characters, the length of a UUID
    job = submit(client, org, vera, "test.report_of", {"project_ids": [not_a_uuid]})
    failed = stack.wait_for(job["id"], "failed", timeout=60)
    kids = children(stack, job["id"])
    print("parent:", failed["error_code"], failed["error_message"], "| parts:",
          [(c["status"], c["error_code"]) for c in kids])
    assert (failed["error_code"], failed["error_message"]) == (
        "invalid_params", "The job parameters are not valid: project_id: must be a UUID.")
    assert kids == []  # refused before any part was made: none reached PostgreSQL
    with stack.admin() as conn:
        assert conn.execute(text("SELECT count(*) FROM job_diagnostics WHERE job_id = :j"),
                            {"j": job["id"]}).scalar_one() == 0


def test_a_parents_children_count_against_its_organizations_quota(stack: Stack, client):
    from spacejobs.models.db.transaction import owner_transaction
    from spacejobs.models.tenancy import accounts

    org = stack.org()
    anna = stack.user(org, role="owner")
    with owner_transaction(stack.admin_db) as conn:
        accounts.set_quota(conn, org, 3)
    parts = [{"n": i, "seconds": 30} for i in range(2)]
    job = submit(client, org, anna, "test.fan", {"parts": parts, "max_parallel": 2})
    wait_until(lambda: len(children(stack, job["id"])) == 2, what="two children spawned")
    # The parent (waiting) and its two children are three active jobs: the organization is full.
    over = client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": "bench.noop"}, headers=anna.auth)
    assert over.status_code == 429 and over.get_json()["error"]["code"] == "too_many_jobs"
    client.post(job["links"]["cancel"], headers=anna.auth)
    wait_until(lambda: all(c["status"] == "cancelled" for c in children(stack, job["id"])),
               timeout=30, what="the children cancelled with their parent")
    assert submit(client, org, anna, "bench.noop")["status"] == "queued"  # room again
