"""Child-only kinds (the parts of a fan-out) exist for their parent alone: a member who names one
in any submit gets the answer of a kind that does not exist, and no job is written. The parent's
own fan-out keeps creating them (tests/integration/test_fan_out.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from spacejobs.models.errors import UnknownKind
from spacejobs.models.jobs import service
from spacejobs.models.jobs.service import Jobs
from tests.conftest import csrf_of, sign_in, submit
from tests.kit.stack import Stack

PASSWORD = "correct horse battery staple"
#: what the review submitted: 36 characters, not a UUID (PostgreSQL quoted it back in its error)
NOT_A_UUID = "MEMBER-TEXT-" + "x" * 24
#: the parts of projects_report and of the tests' own fan-out
CHILD_ONLY = [("projects_report.project", {"project_id": NOT_A_UUID}),
              ("test.part", {"n": 1})]
NO_SUCH_KIND = "projects_report.nonexistent"


def answer_of(response) -> tuple[int, object]:
    return response.status_code, response.get_json()


def seen(response) -> str:
    """The answer in one short line, for the test's output."""
    body = response.get_json() or {}
    if "error" in body and "id" not in body:
        return f"{response.status_code} {body['error']['code']}"
    jobs = body.get("jobs", [body])
    return f"{response.status_code} " + ", ".join(f"{j.get('kind')} {j.get('status')}" for j in jobs)


@pytest.mark.parametrize("kind, params", CHILD_ONLY)
def test_a_member_submitting_a_child_only_kind_gets_the_unknown_kind_answer(stack: Stack, client,
                                                                            kind, params):
    org = stack.org()
    vera = stack.user(org, role="member")
    url = f"/api/v1/orgs/{org}/jobs"
    child = client.post(url, json={"kind": kind, "params": params}, headers=vera.auth)
    unknown = client.post(url, json={"kind": NO_SUCH_KIND, "params": params}, headers=vera.auth)
    print("single submit of", kind, "->", seen(child))
    # The same answer, in the same words, each naming the kind it was sent.
    assert answer_of(child) == (400, {"error": {
        "code": "unknown_kind", "message": f"There is no job of the kind “{kind}”."}})
    assert answer_of(unknown) == (400, {"error": {
        "code": "unknown_kind", "message": f"There is no job of the kind “{NO_SUCH_KIND}”."}})
    assert stack.count_jobs(org) == 0


@pytest.mark.parametrize("kind, params", CHILD_ONLY)
def test_a_batch_holding_a_child_only_kind_is_refused_as_an_unknown_kind(stack: Stack, client,
                                                                         kind, params):
    org = stack.org()
    vera = stack.user(org, role="member")
    url = f"/api/v1/orgs/{org}/jobs:batch"

    def batch(name: str):
        return client.post(url, headers=vera.auth, json={"jobs": [
            {"kind": "bench.noop"}, {"kind": name, "params": params}]})

    child, unknown = batch(kind), batch(NO_SUCH_KIND)
    print("batch submit of", kind, "->", seen(child))
    assert child.get_data(as_text=True).replace(kind, "KIND") == unknown.get_data(
        as_text=True).replace(NO_SUCH_KIND, "KIND")
    assert answer_of(child)[0] == 400
    assert answer_of(child)[1]["error"]["code"] == "unknown_kind"
    assert answer_of(child)[1]["error"]["index"] == 1
    assert stack.count_jobs(org) == 0


def test_the_jobs_page_form_answers_a_child_only_kind_as_an_unknown_one(stack: Stack, app):
    org = stack.org()
    vera = stack.user(org, role="member", password=PASSWORD)
    browser = app.test_client()
    sign_in(browser, vera)
    csrf = csrf_of(browser.get(f"/orgs/{org}/jobs"))
    html = {"Accept": "text/html"}
    child = browser.post(f"/orgs/{org}/jobs", headers=html,
                         data={"kind": "projects_report.project", "csrf": csrf})
    unknown = browser.post(f"/orgs/{org}/jobs", headers=html,
                           data={"kind": NO_SUCH_KIND, "csrf": csrf})
    print("page form ->", child.status_code)
    assert (child.status_code, child.data) == (unknown.status_code, unknown.data)
    assert child.status_code == 404
    assert stack.count_jobs(org) == 0


@pytest.mark.parametrize("kind, params", CHILD_ONLY)
def test_application_code_cannot_submit_a_child_only_kind_through_the_python_api(
        stack: Stack, app_db, kind, params):
    org = stack.org()
    anna = stack.user(org, role="owner")
    with pytest.raises(UnknownKind), app_db.begin() as conn:
        submitted = Jobs(conn.engine).submit(conn, kind, params, organization_id=org, requested_by=anna.id)
        print("service.submit of", kind, "->", submitted.job.status)
    with pytest.raises(UnknownKind) as refused, app_db.begin() as conn:
        written = Jobs(conn.engine).submit_many(conn, [service.JobRequest("bench.noop"),
                                             service.JobRequest(kind, params)],
                                      organization_id=org, requested_by=anna.id)
        print("service.submit_many of", kind, "->", [job.kind for job in written])
    assert refused.value.details["index"] == 1
    assert stack.count_jobs(org) == 0


def test_the_openapi_document_offers_no_child_only_kind(client):
    document = client.get("/api/v1/openapi.json")
    assert document.status_code == 200
    offered = document.get_json()["components"]["schemas"]["SubmitJob"]["properties"]["kind"]["enum"]
    print("child-only kinds offered:", sorted({"projects_report.project", "test.part"} & set(offered)))
    assert "projects_report" in offered and "test.fan" in offered
    assert "projects_report.project" not in document.get_data(as_text=True)
    assert "test.part" not in offered


def test_an_operator_retries_a_failed_part_through_its_parent_not_alone(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    olga = stack.operator()
    job = submit(client, org, anna, "test.fan", {"parts": [{"n": 0, "fail": True}]})
    stack.wait_for(job["id"], "failed", timeout=60)
    with stack.admin() as conn:
        part = conn.execute(text("SELECT id FROM jobs WHERE parent_id = :p"),
                            {"p": job["id"]}).scalar_one()
    retried = client.post(f"/ops/api/jobs/{part}/retry", headers=olga.auth)
    print("operator retry of a part ->", seen(retried))
    assert answer_of(retried) == (400, {"error": {
        "code": "invalid_request",
        "message": "This job is a part of a fan-out: retry its parent instead."}})
    again = client.post(f"/ops/api/jobs/{job['id']}/retry", headers=olga.auth)
    assert again.status_code in (200, 201, 202), again.get_json()
