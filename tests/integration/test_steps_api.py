"""Clients see and steer a workflow's steps over HTTP: the job JSON links a parent's steps and a
step its parent; ``GET …/jobs/{id}/steps`` lists them, paged, those not made yet included;
``GET …/jobs/{id}/steps/results`` gives the completed steps' results (a failed workflow's
partial results) by the rule of the parent's result; a signal sent to a workflow reaches the
step that waits for it, or is refused; a refused step is named in the error body. Each door is
tried as the attacker would, as the web role (space_app), never a superuser. Real PostgreSQL,
Redis and workers."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text

from spacejobs.models.db.transaction import transaction
from spacejobs.models.errors import InsufficientRole, NoStepWaits
from spacejobs.models.jobs.canvas import chain, chord, sig
from tests.kit.seeding import TestUser
from tests.kit.stack import Stack
from tests.kit.waiting import wait_until

SECRET = "payload-secret-5b19"


@pytest.fixture(scope="module")
def client(stack: Stack) -> Any:
    return stack.make_app().test_client()


def start(stack: Stack, org: uuid.UUID, user: TestUser, canvas: Any, **options: Any) -> uuid.UUID:
    with stack.app_db.begin() as conn:
        return stack.jobs.submit_workflow(conn, canvas, organization_id=org, requested_by=user.id,
                                          **options).job.id


def api(client: Any, user: TestUser, path: str, org: uuid.UUID) -> tuple[int, Any]:
    answer = client.get(f"/api/v1/orgs/{org}/{path}", headers=user.auth)
    return answer.status_code, answer.get_json()


def step_rows(stack: Stack, parent: uuid.UUID) -> dict[int, dict[str, Any]]:
    with stack.admin() as conn:
        rows = conn.execute(text("SELECT child_index, id, status FROM jobs WHERE parent_id = :p"),
                            {"p": parent}).mappings()
        return {row["child_index"]: dict(row) for row in rows}


def waiting_step(stack: Stack, parent: uuid.UUID, place: int) -> uuid.UUID:
    wait_until(lambda: step_rows(stack, parent).get(place, {}).get("status") == "waiting", 30,
               what=f"step {place} waiting for its signal")
    return step_rows(stack, parent)[place]["id"]


def signals_kept(stack: Stack, job_id: uuid.UUID) -> int:
    with stack.admin() as conn:
        return conn.execute(text("SELECT count(*) FROM job_signals WHERE job_id = :j"),
                            {"j": job_id}).scalar_one()


# ------------------------------------------------------------------- seeing the steps

def test_a_workflows_json_links_its_steps_which_list_every_step_and_link_back(stack: Stack,
                                                                              client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    vera = stack.user(org, role="member")  # any member of the organization may read them
    workflow = start(stack, org, anna, chain(
        sig("test.add", n=1, name="warm up"),
        sig("bench.await_signal", {"name": "go-ahead", "timeout": 3600}, name="approval"),
        sig("test.add", n=1, name="wrap up")))
    approval = waiting_step(stack, workflow, 1)
    first = step_rows(stack, workflow)
    status, shown = api(client, vera, f"jobs/{workflow}", org)
    assert status == 200 and (shown["parent_id"], shown["place"]) == (None, None)
    assert shown["links"]["steps"] == f"/api/v1/orgs/{org}/jobs/{workflow}/steps"
    assert "parent" not in shown["links"]

    status, page = api(client, vera, f"jobs/{workflow}/steps", org)
    assert status == 200
    assert (page["job_id"], page["total"], page["next_cursor"]) == (str(workflow), 3, None)
    assert [(s["place"], s["name"], s["kind"], s["status"]) for s in page["steps"]] == [
        (0, "warm up", "test.add", "completed"), (1, "approval", "bench.await_signal", "waiting"),
        (2, "wrap up", "test.add", "pending")]
    made = page["steps"][1]
    assert made["job_id"] == str(approval) and made["attempts"] == 1
    assert made["links"] == {"job": f"/api/v1/orgs/{org}/jobs/{approval}"}
    assert (page["steps"][2]["job_id"], page["steps"][2]["links"]) == (None, None)
    assert page["steps"][0]["job_id"] == str(first[0]["id"])
    assert "go-ahead" not in str(page) and "params" not in str(page)  # never a step's params

    status, step = api(client, vera, f"jobs/{approval}", org)
    assert (step["parent_id"], step["place"]) == (str(workflow), 1)
    assert step["links"]["parent"] == f"/api/v1/orgs/{org}/jobs/{workflow}"
    assert step["attempts"] == 1 and step["waiting_for"]["signal"] == "go-ahead"  # it ran, waits

    # Paged like the other lists: one at a time, each page naming the next.
    names, cursor = [], ""
    while cursor is not None:
        status, page = api(client, vera, f"jobs/{workflow}/steps?limit=1&cursor={cursor}", org)
        assert status == 200 and len(page["steps"]) == 1
        names.append(page["steps"][0]["name"])
        cursor = page["next_cursor"]
    assert names == ["warm up", "approval", "wrap up"]
    status, refused = api(client, vera, f"jobs/{workflow}/steps?cursor=bm9wZQ", org)
    assert (status, refused["error"]["fields"]) == (400, ["cursor"])
    client.post(f"/api/v1/orgs/{org}/jobs/{workflow}/cancel", headers=anna.auth)
    stack.wait_for(workflow, "cancelled")
    status, page = api(client, vera, f"jobs/{workflow}/steps", org)
    assert [s["status"] for s in page["steps"]] == ["completed", "cancelled", "skipped"]


def test_a_plain_jobs_steps_are_an_empty_list(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    job = client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": "test.add"},
                      headers=anna.auth).get_json()
    assert api(client, anna, f"jobs/{job['id']}/steps", org) == (200, {
        "job_id": job["id"], "total": 0, "steps": [], "next_cursor": None})


def test_a_fan_outs_parts_not_released_yet_are_listed_pending_without_an_id(stack: Stack, client):
    """The parts the database has not made yet are the owner's rows (job_fan_out_items): the
    web role reads their places and kind through job_unmade_steps(), never their params."""
    org = stack.org()
    anna = stack.user(org, role="owner")
    parts = [{"n": n, "seconds": 30} for n in range(4)]
    fan = client.post(f"/api/v1/orgs/{org}/jobs", headers=anna.auth, json={
        "kind": "test.fan", "params": {"parts": parts, "max_parallel": 1}}).get_json()
    wait_until(lambda: 0 in step_rows(stack, fan["id"]), 30, what="the first part made")
    status, page = api(client, anna, f"jobs/{fan['id']}/steps", org)
    assert status == 200 and page["total"] == 4
    assert [(s["place"], s["name"], s["kind"], s["job_id"] is not None) for s in page["steps"]] == [
        (0, None, "test.part", True), (1, None, "test.part", False),
        (2, None, "test.part", False), (3, None, "test.part", False)]
    assert [s["status"] for s in page["steps"][1:]] == ["pending"] * 3
    status, page = api(client, anna, f"jobs/{fan['id']}/steps?limit=2&cursor=", org)
    assert [s["place"] for s in page["steps"]] == [0, 1] and page["next_cursor"]
    status, rest = api(client, anna, f"jobs/{fan['id']}/steps?cursor={page['next_cursor']}", org)
    assert [s["place"] for s in rest["steps"]] == [2, 3] and rest["next_cursor"] is None
    client.post(f"/api/v1/orgs/{org}/jobs/{fan['id']}/cancel", headers=anna.auth)


def test_the_web_role_reads_no_other_organizations_unmade_steps(stack: Stack, client):
    """Attack: the web's credential calls job_unmade_steps() for another organization's
    fan-out, in its own organization's transaction."""
    org, elsewhere = stack.org(), stack.org()
    anna = stack.user(org, role="owner")
    mallory = stack.user(elsewhere, role="owner")
    parts = [{"n": n, "seconds": 30} for n in range(3)]
    fan = client.post(f"/api/v1/orgs/{org}/jobs", headers=anna.auth, json={
        "kind": "test.fan", "params": {"parts": parts, "max_parallel": 1}}).get_json()
    wait_until(lambda: 0 in step_rows(stack, fan["id"]), 30, what="the first part made")
    query = text("SELECT total, places, kinds FROM job_unmade_steps(:p, -1, 1000)")
    with transaction(stack.app_db, organization_id=elsewhere, user_id=mallory.id) as conn:
        assert conn.execute(query, {"p": fan["id"]}).one() == (None, [], [])
    with transaction(stack.app_db, organization_id=org, user_id=anna.id) as conn:
        assert conn.execute(query, {"p": fan["id"]}).one() == (3, [1, 2], ["test.part"] * 2)
    assert api(client, mallory, f"jobs/{fan['id']}/steps", elsewhere)[0] == 404
    assert api(client, mallory, f"jobs/{fan['id']}/steps", org)[0] == 404
    client.post(f"/api/v1/orgs/{org}/jobs/{fan['id']}/cancel", headers=anna.auth)


# ------------------------------------------------------------------- partial results

def test_a_failed_workflows_completed_steps_results_are_read_by_name(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    workflow = start(stack, org, anna, chord(
        [sig("test.add", n=1, name="one"), sig("test.boom", name="boom"),
         sig("test.add", n=2, name="two")], sig("test.collect", name="callback")),
        policy="run_all")
    stack.wait_for(workflow, "failed", timeout=60)
    assert api(client, anna, f"jobs/{workflow}/result", org)[1]["error"]["code"] == \
        "job_not_completed"
    status, partial = api(client, anna, f"jobs/{workflow}/steps/results", org)
    assert status == 200 and (partial["status"], partial["next_cursor"]) == ("failed", None)
    assert {r["name"]: r["result"] for r in partial["results"]} == {"one": 1, "two": 2}
    one = partial["results"][0]
    assert (one["place"], one["kind"], one["result_expired"]) == (0, "test.add", False)
    assert one["links"]["result"] == f"/api/v1/orgs/{org}/jobs/{one['job_id']}/result"
    status, page = api(client, anna, f"jobs/{workflow}/steps/results?limit=1", org)
    assert [r["name"] for r in page["results"]] == ["one"] and page["next_cursor"]
    status, rest = api(client, anna,
                       f"jobs/{workflow}/steps/results?cursor={page['next_cursor']}", org)
    assert [r["name"] for r in rest["results"]] == ["two"] and rest["next_cursor"] is None
    # Each read that gave results is in the audit log, as a download of the workflow's.
    log = client.get(f"/api/v1/orgs/{org}/audit?action=job.download", headers=anna.auth)
    assert [e["job_id"] for e in log.get_json()["entries"]] == [str(workflow)] * 3


def test_a_plain_member_reads_no_admin_steps_result_through_the_workflows_steps(stack: Stack,
                                                                                 client):
    """Attack: the admin step's result alone answers 403; its workflow's steps list must not
    carry it, nor the partial results give it (nor any step's: the workflow's result rule, the
    strictest of what it holds, applies to them all)."""
    org = stack.org()
    anna = stack.user(org, role="admin")
    vera = stack.user(org, role="member")
    workflow = start(stack, org, anna, chain(sig("test.add", n=1, name="plain"),
                                             sig("test.admin_step", name="admins")))
    stack.wait_for(workflow, "completed", timeout=60)
    admins = step_rows(stack, workflow)[1]["id"]
    assert api(client, vera, f"jobs/{admins}/result", org)[0] == 403
    status, listed = api(client, vera, f"jobs/{workflow}/steps", org)
    assert status == 200 and [s["status"] for s in listed["steps"]] == ["completed"] * 2
    assert "admins only" not in str(listed)
    status, refused = api(client, vera, f"jobs/{workflow}/steps/results", org)
    assert (status, refused["error"]["code"]) == (403, "insufficient_role")
    assert "admins only" not in str(refused)
    with pytest.raises(InsufficientRole), stack.jobs.transaction(org, vera.id) as (conn, member):
        stack.jobs.step_results(conn, member, workflow)
    status, allowed = api(client, anna, f"jobs/{workflow}/steps/results", org)
    assert status == 200 and [r["result"] for r in allowed["results"]] == [1, {"for": "admins only"}]


def test_another_organizations_member_gets_404_for_steps_results_and_signals(stack: Stack, client):
    org, elsewhere = stack.org(), stack.org()
    anna = stack.user(org, role="owner")
    mallory = stack.user(elsewhere, role="owner")
    workflow = start(stack, org, anna, chain(
        sig("test.add", n=1, name="alpha-step"),
        sig("bench.await_signal", {"name": "go", "timeout": 3600}, name="omega-step")))
    step = waiting_step(stack, workflow, 1)
    missing = client.get(f"/api/v1/orgs/{elsewhere}/jobs/{uuid.uuid4()}/steps",
                         headers=mallory.auth)
    for where in (org, elsewhere):
        for path in (f"jobs/{workflow}/steps", f"jobs/{workflow}/steps/results",
                     f"jobs/{step}/steps", f"jobs/{step}/steps/results"):
            answer = client.get(f"/api/v1/orgs/{where}/{path}", headers=mallory.auth)
            assert (answer.status_code, answer.get_json()) == (404, missing.get_json()), path
            assert b"alpha-step" not in answer.data
        sent = client.post(f"/api/v1/orgs/{where}/jobs/{workflow}/signals/go", json=SECRET,
                           headers=mallory.auth)
        assert sent.status_code == 404
    assert signals_kept(stack, step) == signals_kept(stack, workflow) == 0
    assert step_rows(stack, workflow)[1]["status"] == "waiting"
    client.post(f"/api/v1/orgs/{org}/jobs/{workflow}/cancel", headers=anna.auth)


# ------------------------------------------------------------------- signals

def test_a_signal_sent_to_the_workflow_reaches_the_step_that_waits_for_it(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    workflow = start(stack, org, anna, chain(
        sig("test.add", n=1, name="first"),
        sig("bench.await_signal", {"name": "go", "timeout": 3600}, name="approval")))
    step = waiting_step(stack, workflow, 1)
    sent = client.post(f"/api/v1/orgs/{org}/jobs/{workflow}/signals/go", json={"ok": SECRET},
                       headers=anna.auth)
    assert sent.status_code == 202
    assert sent.get_json() == {"job_id": str(workflow), "signal": "go", "status": "queued",
                               "received_by": str(step)}
    stack.wait_for(workflow, "completed", timeout=30)
    status, done = api(client, anna, f"jobs/{workflow}/result", org)
    assert status == 200
    assert done["result"]["steps"]["approval"] == {"signal": "go", "payload": {"ok": SECRET}}
    assert signals_kept(stack, workflow) == 0  # kept for the step, never for the workflow


def test_a_signal_no_step_waits_for_is_refused_and_nothing_is_kept(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    workflow = start(stack, org, anna, chain(
        sig("bench.await_signal", {"name": "go", "timeout": 3600}, name="approval")))
    step = waiting_step(stack, workflow, 0)
    refused = client.post(f"/api/v1/orgs/{org}/jobs/{workflow}/signals/other", json=SECRET,
                          headers=anna.auth)
    assert refused.status_code == 409
    error = refused.get_json()["error"]
    assert error["code"] == "no_step_waits" and SECRET not in refused.get_data(as_text=True)
    with pytest.raises(NoStepWaits), stack.jobs.transaction(org, anna.id) as (conn, member):
        stack.jobs.signal(conn, member, workflow, "other", SECRET)
    assert signals_kept(stack, workflow) == signals_kept(stack, step) == 0
    assert step_rows(stack, workflow)[0]["status"] == "waiting"
    # Sent to the step's own id, a signal is kept for it until it waits, as for any job.
    kept = client.post(f"/api/v1/orgs/{org}/jobs/{step}/signals/other", headers=anna.auth)
    assert kept.status_code == 202 and kept.get_json()["received_by"] == str(step)
    client.post(f"/api/v1/orgs/{org}/jobs/{workflow}/cancel", headers=anna.auth)


def test_of_two_steps_waiting_for_one_name_the_first_by_place_takes_it(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    workflow = start(stack, org, anna, chord(
        [sig("bench.await_signal", {"name": "go", "timeout": 3600}, name="left"),
         sig("bench.await_signal", {"name": "go", "timeout": 3600}, name="right")],
        sig("test.collect", name="both")))
    left, right = waiting_step(stack, workflow, 0), waiting_step(stack, workflow, 1)
    taken = [client.post(f"/api/v1/orgs/{org}/jobs/{workflow}/signals/go", json=n,
                         headers=anna.auth).get_json()["received_by"] for n in (1, 2)]
    assert taken == [str(left), str(right)]
    stack.wait_for(workflow, "completed", timeout=30)
    status, done = api(client, anna, f"jobs/{workflow}/result", org)
    assert status == 200 and [r["payload"] for r in done["result"]["result"]] == [1, 2]


def test_nobody_signals_a_step_through_its_workflow_that_they_could_not_signal_alone(
        stack: Stack, client):
    """Attack: the admin's approval step refuses a plain member's signal (403); sent to the
    workflow that holds it, the same signal must be refused too, and nothing kept."""
    org = stack.org()
    anna = stack.user(org, role="admin")
    vera = stack.user(org, role="member")
    workflow = start(stack, org, anna, chain(sig("test.admin_approval", timeout=3600,
                                                 name="approval")))
    step = waiting_step(stack, workflow, 0)
    for target in (step, workflow):
        refused = client.post(f"/api/v1/orgs/{org}/jobs/{target}/signals/approve",
                              json={"approved": True}, headers=vera.auth)
        assert refused.status_code == 403, (target, refused.get_json())
        assert refused.get_json()["error"]["code"] == "insufficient_role"
    with pytest.raises(InsufficientRole), stack.jobs.transaction(org, vera.id) as (conn, member):
        stack.jobs.signal(conn, member, workflow, "approve", {"approved": True})
    assert signals_kept(stack, step) == 0 and step_rows(stack, workflow)[0]["status"] == "waiting"
    sent = client.post(f"/api/v1/orgs/{org}/jobs/{workflow}/signals/approve",
                       json={"approved": True}, headers=anna.auth)
    assert sent.status_code == 202 and sent.get_json()["received_by"] == str(step)
    stack.wait_for(workflow, "completed", timeout=30)


# ------------------------------------------------------------------- refusals

@pytest.mark.parametrize("who, step, code, fields", [
    ("owner", {"name": "b", "kind": "no.such.kind"}, "unknown_kind", None),
    ("owner", {"name": "b", "kind": "bench.sleep", "params": {"seconds": 999}}, "invalid_params",
     ["seconds"]),
    ("owner", {"name": "b"}, "invalid_params", ["steps.1.kind"]),
    ("owner", {"name": "a", "kind": "bench.noop"}, "invalid_request", ["steps"]),
    ("member", {"name": "b", "kind": "test.admin_step"}, "insufficient_role", None),
])
def test_a_refused_step_is_named_in_the_error_body(stack: Stack, client, who, step, code, fields):
    org = stack.org()
    user = stack.user(org, role=who)
    body = {"kind": "workflow", "params": {"steps": [{"name": "a", "kind": "bench.noop"}, step]}}
    for url, item in ((f"/api/v1/orgs/{org}/jobs", body),
                      (f"/api/v1/orgs/{org}/jobs:batch", {"jobs": [{"kind": "bench.noop"}, body]})):
        answer = client.post(url, json=item, headers=user.auth)
        error = answer.get_json()["error"]
        assert (error["code"], error["step"], error.get("fields")) == (code, 1, fields), error
        assert error.get("index") == (1 if url.endswith(":batch") else None)
    assert stack.count_jobs(org) == 0
    if code == "unknown_kind":
        assert error["message"] == "steps.1: There is no job of the kind “no.such.kind”."
