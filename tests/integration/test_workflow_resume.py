"""Resume and failure handling (issue 31) on real workers: a failed or cancelled workflow resumed
as a new workflow that runs only what did not complete (the completed steps' jobs are never
leased again), refused for a workflow that did not end badly and for a member who may not
cancel it, audited; and a workflow's failure handler, run once with what failed, not on success,
and refused at the submit like a step."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

from spacejobs.models.errors import AlreadyResumed, InvalidParams, NotResumable, UnknownKind
from spacejobs.models.jobs.canvas import chain, sig
from tests.conftest import csrf_of, sign_in
from tests.integration.test_workflows import start
from tests.kit.stack import Stack, wait_until

HTML = {"Accept": "text/html"}
PASSWORD = "a member's long password"


def leases_by_place(stack: Stack, workflow_id: object) -> dict[int, int]:
    """How many times each step made under the workflow was leased (run), by place."""
    with stack.admin() as conn:
        return dict(conn.execute(text(
            "SELECT c.child_index, count(e.*) FILTER (WHERE e.to_status = 'leased')::integer"
            " FROM jobs c LEFT JOIN job_history e ON e.job_id = c.id WHERE c.parent_id = :id"
            " GROUP BY 1"), {"id": workflow_id}).all())


def gated_chain(gate: Path):
    return chain(sig("test.add", n=1, name="one"), sig("test.add", n=2, name="two"),
                 sig("test.gate", path=str(gate), name="gate"), sig("test.add", n=4, name="last"))


def test_a_resumed_workflow_runs_only_the_failed_and_later_steps(stack: Stack, client,
                                                                 tmp_path: Path):
    gate = tmp_path / "open"
    org, anna, failed = start(stack, gated_chain(gate))
    outcome = stack.jobs.wait(failed.id, 60, organization_id=org)
    assert (outcome.job.status, outcome.job.error_code) == ("failed", "steps_failed")
    assert leases_by_place(stack, failed.id) == {0: 1, 1: 1, 2: 1}
    gate.touch()

    answer = client.post(f"/api/v1/orgs/{org}/jobs/{failed.id}/resume", headers=anna.auth)
    assert answer.status_code == 202, answer.get_json()
    resumed = answer.get_json()
    assert resumed["kind"] == "workflow" and resumed["status"] == "queued"
    assert resumed["id"] != str(failed.id)
    done = stack.jobs.wait(uuid.UUID(resumed["id"]), 60, organization_id=org)
    assert done.job.status == "completed"
    # The reused steps' results reach the steps that read them, and the whole's result.
    assert done.result["steps"] == {"one": 1, "two": 3, "gate": {"inputs": [3]}, "last": 4}
    # Only the failed step and those after it ran again, as jobs of the new workflow; the old
    # run's completed steps were leased once, ever, and its row is still what it was.
    assert leases_by_place(stack, failed.id) == {0: 1, 1: 1, 2: 1}
    assert leases_by_place(stack, resumed["id"]) == {2: 1, 3: 1}
    assert stack.job_row(failed.id)["status"] == "failed"
    assert stack.job_row(resumed["id"])["retry_of"] == failed.id
    # Its steps list every place: the reused ones as the completed jobs they are.
    steps = client.get(f"/api/v1/orgs/{org}/jobs/{resumed['id']}/steps",
                       headers=anna.auth).get_json()["steps"]
    assert [(s["name"], s["status"]) for s in steps] == [
        ("one", "completed"), ("two", "completed"), ("gate", "completed"), ("last", "completed")]
    results = client.get(f"/api/v1/orgs/{org}/jobs/{resumed['id']}/steps/results",
                         headers=anna.auth).get_json()["results"]
    assert [(r["name"], r["result"]) for r in results] == [
        ("one", 1), ("two", 3), ("gate", {"inputs": [3]}), ("last", 4)]


def test_a_resume_is_audited_and_happens_once(stack: Stack, client, tmp_path: Path):
    org, anna, failed = start(stack, gated_chain(tmp_path / "never"))
    stack.jobs.wait(failed.id, 60, organization_id=org)
    first = client.post(f"/api/v1/orgs/{org}/jobs/{failed.id}/resume", headers=anna.auth)
    assert first.status_code == 202
    again = client.post(f"/api/v1/orgs/{org}/jobs/{failed.id}/resume", headers=anna.auth)
    assert again.status_code == 409
    assert again.get_json()["error"]["code"] == "already_resumed"
    assert again.get_json()["error"]["job_id"] == first.get_json()["id"]
    with stack.admin() as conn:
        audit = conn.execute(text(
            "SELECT actor_id, job_id, detail FROM org_audit"
            " WHERE organization_id = :org AND action = 'job.resume'"), {"org": org}).all()
    assert [(a.actor_id, str(a.job_id), a.detail) for a in audit] == [
        (anna.id, first.get_json()["id"],
         {"kind": "workflow", "retry_of": str(failed.id), "status": "failed"})]
    # The owners read it in the organization's audit log, by its action.
    log = client.get(f"/api/v1/orgs/{org}/audit?action=job.resume", headers=anna.auth)
    assert log.status_code == 200 and first.get_json()["id"] in log.get_data(as_text=True)
    # The resume that failed again may itself be resumed.
    new_id = uuid.UUID(first.get_json()["id"])
    assert stack.jobs.wait(new_id, 60, organization_id=org).job.status == "failed"
    with stack.app_db.begin() as conn:
        member = stack.jobs.member(conn, org, anna.id)
        third = stack.jobs.resume(conn, member, new_id)
        with pytest.raises(AlreadyResumed):  # its own savepoint undoes it, not the first
            stack.jobs.resume(conn, member, new_id)
    assert third.status == "queued"
    assert stack.jobs.wait(third.id, 60, organization_id=org).job.status == "failed"
    # Each run ran the gate once; the first two steps only ever once.
    assert leases_by_place(stack, failed.id) == {0: 1, 1: 1, 2: 1}
    assert leases_by_place(stack, new_id) == {2: 1}
    assert leases_by_place(stack, third.id) == {2: 1}


def test_a_cancelled_workflow_resumes_from_its_completed_steps(stack: Stack, client):
    org, anna, job = start(stack, chain(sig("test.add", n=5, name="first"),
                                        sig("bench.sleep", seconds=30, name="long"),
                                        sig("test.add", n=1, name="after")))
    wait_until(lambda: leases_by_place(stack, job.id).get(1) == 1, 30, "the long step running")
    assert client.post(f"/api/v1/orgs/{org}/jobs/{job.id}/cancel",
                       headers=anna.auth).status_code == 200
    assert stack.jobs.wait(job.id, 30, organization_id=org).job.status == "cancelled"

    with stack.app_db.begin() as conn:
        member = stack.jobs.member(conn, org, anna.id)
        resumed = stack.jobs.resume(conn, member, job.id)
    # The cancelled step runs again, from its start (the test cancels it again there).
    wait_until(lambda: leases_by_place(stack, resumed.id).get(1) == 1, 30,
               "the cancelled step running again")
    assert 0 not in leases_by_place(stack, resumed.id)  # the completed step is not run again
    assert leases_by_place(stack, job.id)[0] == 1
    client.post(f"/api/v1/orgs/{org}/jobs/{resumed.id}/cancel", headers=anna.auth)
    assert stack.jobs.wait(resumed.id, 30, organization_id=org).job.status == "cancelled"


def test_only_a_failed_or_cancelled_workflow_resumes(stack: Stack, client):
    org, anna, done = start(stack, chain(sig("test.add", n=1)))
    assert stack.jobs.wait(done.id, 60, organization_id=org).job.status == "completed"
    _, _, running = start(stack, chain(sig("bench.sleep", seconds=30)), org=org, user=anna)
    stack.wait_for(running.id, "waiting", timeout=30)
    with stack.app_db.begin() as conn:
        plain = stack.jobs.submit(conn, "test.boom", organization_id=org,
                                  requested_by=anna.id).job
    assert stack.jobs.wait(plain.id, 60, organization_id=org).job.status == "failed"
    before = stack.count_jobs(org)
    for job_id, status in ((done.id, "completed"), (running.id, "waiting"),
                           (plain.id, "failed")):
        answer = client.post(f"/api/v1/orgs/{org}/jobs/{job_id}/resume", headers=anna.auth)
        assert answer.status_code == 409, job_id
        assert answer.get_json()["error"]["code"] == "job_not_resumable"
        assert answer.get_json()["error"]["status"] == status
    assert stack.count_jobs(org) == before  # nothing was written
    with stack.app_db.begin() as conn, pytest.raises(NotResumable):
        stack.jobs.resume(conn, stack.jobs.member(conn, org, anna.id), done.id)
    client.post(f"/api/v1/orgs/{org}/jobs/{running.id}/cancel", headers=anna.auth)


def test_a_plain_member_may_not_resume_a_workflow_holding_an_admin_only_step(stack: Stack,
                                                                             client):
    """Attack: a plain member of the organization, who may not start or cancel an admin's step,
    resumes the admin's failed workflow that holds one, to have it run again. Refused as the
    cancel is (the strictest role of what it holds), over HTTP as the web role; nothing is
    written. Another organization's member gets 404; the admin may."""
    org = stack.org()
    ada = stack.user(org, role="admin")
    vera = stack.user(org, role="member")
    _, _, failed = start(stack, chain(sig("test.admin_step", name="admin"),
                                      sig("test.boom", name="boom")), org=org, user=ada)
    assert stack.jobs.wait(failed.id, 60, organization_id=org).job.status == "failed"
    before = stack.count_jobs(org)
    refused = client.post(f"/api/v1/orgs/{org}/jobs/{failed.id}/resume", headers=vera.auth)
    assert refused.status_code == 403
    assert refused.get_json()["error"]["code"] == "insufficient_role"
    outsider_org = stack.org()
    outsider = stack.user(outsider_org, role="owner")
    assert client.post(f"/api/v1/orgs/{outsider_org}/jobs/{failed.id}/resume",
                       headers=outsider.auth).status_code == 404
    assert client.post(f"/api/v1/orgs/{org}/jobs/{failed.id}/resume",
                       headers=outsider.auth).status_code == 404
    assert stack.count_jobs(org) == before
    with stack.admin() as conn:
        assert conn.execute(text("SELECT count(*) FROM org_audit WHERE action = 'job.resume'"
                                 " AND organization_id = :org"), {"org": org}).scalar_one() == 0
    other_admin = stack.user(org, role="admin")
    allowed = client.post(f"/api/v1/orgs/{org}/jobs/{failed.id}/resume", headers=other_admin.auth)
    assert allowed.status_code == 202
    assert stack.job_row(allowed.get_json()["id"])["requested_by"] == ada.id


def handler_jobs(stack: Stack, workflow_id: object) -> list[dict]:
    with stack.admin() as conn:
        rows = conn.execute(text(
            "SELECT j.id, j.kind, j.status, j.requested_by, j.organization_id, j.parent_id"
            " FROM job_failure_handlers h JOIN jobs j ON j.id = h.handler_id"
            " WHERE h.workflow_id = :id"), {"id": workflow_id}).mappings().all()
    return [dict(row) for row in rows]


def test_the_failure_handler_runs_once_with_what_failed(stack: Stack, tmp_path: Path):
    org = stack.org()
    vera = stack.user(org, role="member")
    canvas = chain(sig("test.add", n=1, name="one"),
                   sig("test.gate", path=str(tmp_path / "never"), name="gate"),
                   sig("test.add", n=1, name="after")).on_failure(
        sig("test.on_failure", note="page the on-call"))
    _, _, failed = start(stack, canvas, org=org, user=vera)
    assert stack.jobs.wait(failed.id, 60, organization_id=org).job.status == "failed"
    wait_until(lambda: len(handler_jobs(stack, failed.id)) == 1, 30, "the handler made")
    (handler,) = handler_jobs(stack, failed.id)
    # A job of its own, in the organization, by the requester; no step of the workflow.
    assert (handler["kind"], handler["requested_by"], handler["organization_id"],
            handler["parent_id"]) == ("test.on_failure", vera.id, org, None)
    outcome = stack.jobs.wait(handler["id"], 60, organization_id=org)
    assert outcome.job.status == "completed"
    assert outcome.result == {"note": "page the on-call", "inputs": 1, "failure": {
        "workflow_id": str(failed.id),
        "failed": [{"place": 1, "name": "gate", "kind": "test.gate", "status": "failed",
                    "error_code": "gate_closed"}],
        "skipped": [{"place": 2, "name": "after", "kind": "test.add"}]}}
    # Its outcome changes nothing of the workflow's.
    assert stack.job_row(failed.id)["status"] == "failed"

    # A resumed workflow that fails again runs its handler again, once.
    with stack.app_db.begin() as conn:
        resumed = stack.jobs.resume(conn, stack.jobs.member(conn, org, vera.id), failed.id)
    assert stack.jobs.wait(resumed.id, 60, organization_id=org).job.status == "failed"
    wait_until(lambda: len(handler_jobs(stack, resumed.id)) == 1, 30, "the second handler")
    assert len(handler_jobs(stack, failed.id)) == 1
    with stack.admin() as conn:
        handlers = conn.execute(text("SELECT count(*) FROM jobs WHERE organization_id = :org"
                                     " AND kind = 'test.on_failure'"), {"org": org}).scalar_one()
    assert handlers == 2


def test_the_failure_handler_does_not_run_on_success_nor_on_cancel(stack: Stack, client):
    handler = sig("test.on_failure", note="never")
    org, anna, done = start(stack, chain(sig("test.add", n=1)).on_failure(handler))
    assert stack.jobs.wait(done.id, 60, organization_id=org).job.status == "completed"
    _, _, cancelled = start(stack, chain(sig("bench.sleep", seconds=30)).on_failure(handler),
                            org=org, user=anna)
    stack.wait_for(cancelled.id, "waiting", timeout=30)
    client.post(f"/api/v1/orgs/{org}/jobs/{cancelled.id}/cancel", headers=anna.auth)
    assert stack.jobs.wait(cancelled.id, 30, organization_id=org).job.status == "cancelled"
    with stack.admin() as conn:
        made = conn.execute(text("SELECT count(*) FROM jobs WHERE organization_id = :org"
                                 " AND kind = 'test.on_failure'"), {"org": org}).scalar_one()
    assert made == 0


def test_a_failure_handler_a_submit_would_refuse_refuses_the_workflow(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    vera = stack.user(org, role="member")
    with pytest.raises(UnknownKind) as unknown, stack.app_db.begin() as conn:
        stack.jobs.submit_workflow(conn, chain(sig("test.add")), organization_id=org,
                                   requested_by=anna.id, on_failure=sig("no.such.kind"))
    assert unknown.value.details["step"] == "on_failure"
    with pytest.raises(InvalidParams) as invalid, stack.app_db.begin() as conn:
        stack.jobs.submit_workflow(conn, chain(sig("test.add")).on_failure(
            sig("test.on_failure", note="")), organization_id=org, requested_by=anna.id)
    assert invalid.value.details["step"] == "on_failure"
    steps = [{"name": "a", "kind": "test.add"}]
    for handler, code, status in (
            ({"kind": "test.on_failure", "params": {"nope": 1}}, "invalid_params", 400),
            ({"kind": "workflow"}, "invalid_request", 400),
            ({"params": {}}, "invalid_params", 400)):
        answer = client.post(f"/api/v1/orgs/{org}/jobs", headers=anna.auth, json={
            "kind": "workflow", "params": {"steps": steps, "on_failure": handler}})
        assert answer.status_code == status, answer.get_json()
        assert answer.get_json()["error"]["code"] == code
        assert answer.get_json()["error"]["step"] == "on_failure"
    # A handler the requester may not start refuses the workflow, naming it.
    answer = client.post(f"/api/v1/orgs/{org}/jobs", headers=vera.auth, json={
        "kind": "workflow", "params": {"steps": steps, "on_failure": {"kind": "test.admin_step"}}})
    assert answer.status_code == 403
    assert answer.get_json()["error"] == {
        "code": "insufficient_role", "step": "on_failure",
        "message": "Your role in this organization does not allow this operation."}
    assert stack.count_jobs(org) == 0


def test_the_job_page_offers_resume_only_to_who_may_and_it_resumes(stack: Stack, app):
    org = stack.org()
    ada = stack.user(org, role="admin", password=PASSWORD)
    vera = stack.user(org, role="member", password=PASSWORD)
    _, _, failed = start(stack, chain(sig("test.admin_step", name="admin"),
                                      sig("test.boom", name="boom")), org=org, user=ada)
    assert stack.jobs.wait(failed.id, 60, organization_id=org).job.status == "failed"
    url = f"/orgs/{org}/jobs/{failed.id}"
    as_vera = app.test_client()
    sign_in(as_vera, vera)
    assert ">Resume</button>" not in as_vera.get(url).get_data(as_text=True)
    as_ada = app.test_client()
    sign_in(as_ada, ada)
    page = as_ada.get(url)
    assert ">Resume</button>" in page.get_data(as_text=True)
    # A plain member's post is refused as the API refuses it, and writes nothing.
    before = stack.count_jobs(org)
    assert as_vera.post(url + "/resume", data={"csrf": csrf_of(as_vera.get(url))},
                        headers=HTML).status_code == 403
    assert stack.count_jobs(org) == before
    answer = as_ada.post(url + "/resume", data={"csrf": csrf_of(page)})
    assert answer.status_code == 302
    new_id = answer.headers["Location"].rsplit("/", 1)[1]
    assert stack.job_row(new_id)["retry_of"] == failed.id
    assert "Resumed:" in as_ada.get(f"/orgs/{org}/jobs/{new_id}").get_data(as_text=True)
    # The old one's page now links its resume instead of offering another.
    old_page = as_ada.get(url).get_data(as_text=True)
    assert ">Resume</button>" not in old_page
    assert f'Resumed as <a href="/orgs/{org}/jobs/{new_id}">' in old_page
    # A completed workflow offers none.
    _, _, done = start(stack, chain(sig("test.add", n=1)), org=org, user=ada)
    assert stack.jobs.wait(done.id, 60, organization_id=org).job.status == "completed"
    assert ">Resume</button>" not in as_ada.get(f"/orgs/{org}/jobs/{done.id}").get_data(as_text=True)


def test_a_workflow_whose_requester_left_is_not_resumed(stack: Stack, client, tmp_path: Path):
    org = stack.org()
    owner = stack.user(org, role="owner")
    vera = stack.user(org, role="member")
    _, _, failed = start(stack, gated_chain(tmp_path / "never"), org=org, user=vera)
    assert stack.jobs.wait(failed.id, 60, organization_id=org).job.status == "failed"
    stack.remove_member(org, vera.id)
    before = stack.count_jobs(org)
    answer = client.post(f"/api/v1/orgs/{org}/jobs/{failed.id}/resume", headers=owner.auth)
    assert answer.status_code == 409
    assert answer.get_json()["error"]["code"] == "requester_not_member"
    assert stack.count_jobs(org) == before


def test_a_resume_is_admitted_like_a_submit_of_the_whole_workflow_then_gives_back_what_it_reuses(
        stack: Stack, client, tmp_path: Path):
    from spacejobs.models.tenancy import accounts

    org = stack.org()
    anna = stack.user(org, role="owner")
    _, _, failed = start(stack, gated_chain(tmp_path / "never"), org=org, user=anna)
    assert stack.jobs.wait(failed.id, 60, organization_id=org).job.status == "failed"
    # Admitted as its submit is: the workflow and its four steps, 5 active jobs. Over a cap of
    # 4, refused with nothing written; at 5 admitted, and the two places it reuses given back.
    with stack.admin() as conn:
        accounts.set_quota(conn, org, 4, None)
    before = stack.count_jobs(org)
    refused = client.post(f"/api/v1/orgs/{org}/jobs/{failed.id}/resume", headers=anna.auth)
    assert refused.status_code == 429
    assert refused.get_json()["error"]["code"] == "too_many_jobs"
    assert stack.count_jobs(org) == before
    with stack.admin() as conn:
        accounts.set_quota(conn, org, 5, None)
    with stack.workers_paused():
        allowed = client.post(f"/api/v1/orgs/{org}/jobs/{failed.id}/resume", headers=anna.auth)
        assert allowed.status_code == 202, allowed.get_json()
        with stack.admin() as conn:
            reserved = conn.execute(text(
                "SELECT coalesce(sum(reserved), 0) FROM job_reservations WHERE parent_id = :id"),
                {"id": allowed.get_json()["id"]}).scalar_one()
        assert reserved == 2  # the gate and the step after it; the reused two take no place
        assert client.get(f"/api/v1/orgs/{org}/jobs/{allowed.get_json()['id']}",
                          headers=anna.auth).status_code == 200
    with stack.admin() as conn:
        active = conn.execute(text("SELECT active_jobs(:org, NULL)"), {"org": org}).scalar_one()
    assert active <= 3  # the new workflow and at most its two steps still to run
