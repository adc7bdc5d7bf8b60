"""One size and depth limit at every JSON door, tried as the attack (docs/security.md: "a signal's
payload nested ~950 deep was accepted").

The review's attack: a signal payload nested ~950 deep was accepted (202), and the job that
took it then failed ``internal_error`` on every attempt, because the web read JSON nested
deeper than a worker can. Now every value that enters, by any door (a job's params, a workflow
step's params, a signal's payload, an uploaded file; through the HTTP API, the pages or the
Python API), may nest arrays and objects at most 64 levels deep, and is refused before
anything is written past that; a value at the limit is accepted AND runs: its job completes
with it. What a kind writes (its result, a step's value) may wrap such a value in up to 8
levels of its own (72): past that its attempt fails at once with ``result_not_storable``.

The limits are the documented ones, written out here (not imported), so that this module runs
against code without them and fails there as the attack succeeded.
"""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
import requests
from sqlalchemy import text

from spacejobs.models.errors import DomainError, InvalidRequest
from spacejobs.models.jobs.canvas import chain, sig
from spacejobs.models.jobs.service import JobRequest
from tests.conftest import csrf_of, served, sign_in, submit
from tests.kit.stack import Stack

#: how deep a value that enters may nest (docs/reference/http-api.md, "Limits")
LIMIT = 64
#: what a kind writes may add this many levels around such a value
WRAPPED = LIMIT + 8
PASSWORD = "correct horse battery staple"
HTML = {"Accept": "text/html"}
PROBLEM = re.compile(r'<p class="problem" role="alert" id="problem">([^<]+)</p>')


def nested(depth: int) -> Any:
    """Lists nested ``depth`` levels deep: ``[[…[]…]]`` (1 is ``[]``)."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def nested_text(depth: int) -> str:
    """The same as JSON text (json.dumps would itself recurse that deep)."""
    return "[" * depth + "]" * depth


def params_text(depth: int, kind: str = "test.echo") -> str:
    """A submit's body whose params are nested ``depth`` levels deep: ``{"data": […]}``."""
    return f'{{"kind": "{kind}", "params": {{"data": {nested_text(depth - 1)}}}}}'


@pytest.fixture(scope="module")
def people(stack: Stack):
    org = stack.org()
    return org, stack.user(org, role="owner", password=PASSWORD)


def assert_refused(answer, field: str | None = None) -> dict[str, Any]:
    """A 400 ``invalid_request`` that says the limit (and names ``field``); ``answer`` from the
    test client or from requests."""
    if isinstance(answer, requests.Response):
        status, body = answer.status_code, answer.json()
    else:
        status, body = answer.status_code, answer.get_json()
    assert status == 400, (status, body)
    error = body["error"]
    assert error["code"] == "invalid_request", error
    assert f"{LIMIT} levels" in error["message"], error  # the limit, in words
    if field:
        assert error["fields"] == [field], error
    return error


def signals_of(stack: Stack, job_id: Any) -> int:
    with stack.admin() as conn:
        return conn.execute(text("SELECT count(*) FROM job_signals WHERE job_id = :id"),
                            {"id": job_id}).scalar_one()


def post_json(client, url: str, body: str, user):
    return client.post(url, data=body, headers=user.auth, content_type="application/json")


# -- signals: the finding ----------------------------------------------------------------------

def test_a_signal_payload_nested_950_deep_is_refused_and_never_reaches_the_job(stack: Stack, app,
                                                                                client, people):
    """Through a real server, as the review sent it: a request's thread starts with a shallow
    stack, so Python's parser reads 950 levels there (the test client's deeper stack would
    make it give up on its own)."""
    org, anna = people
    job = submit(client, org, anna, "bench.await_signal", {"name": "go", "timeout": 60})
    stack.wait_for(job["id"], "waiting")
    path = f"/api/v1/orgs/{org}/jobs/{job['id']}/signals/go"
    headers = anna.auth | {"Content-Type": "application/json"}
    with served(app) as base:
        assert_refused(requests.post(base + path, data=nested_text(950), headers=headers, timeout=10))
        assert_refused(requests.post(base + path, data=nested_text(LIMIT + 1), headers=headers,
                                     timeout=10), "payload")
        assert_refused(requests.post(base + path, data='{"a": ' + nested_text(LIMIT) + "}",
                                     headers=headers, timeout=10), "payload")
    assert signals_of(stack, job["id"]) == 0
    assert stack.job_row(job["id"])["status"] == "waiting"  # still waiting for a signal it can take
    client.post(f"/api/v1/orgs/{org}/jobs/{job['id']}/cancel", headers=anna.auth)


def test_a_signal_payload_at_the_limit_is_accepted_and_the_job_completes_with_it(stack: Stack, client,
                                                                                  people):
    org, anna = people
    job = submit(client, org, anna, "bench.await_signal", {"name": "go", "timeout": 60})
    stack.wait_for(job["id"], "waiting")
    sent = post_json(client, f"/api/v1/orgs/{org}/jobs/{job['id']}/signals/go", nested_text(LIMIT),
                     anna)
    assert sent.status_code == 202, sent.get_json()
    done = stack.wait_for(job["id"], "completed", "failed")
    assert done["status"] == "completed", (done["error_code"], done["error_message"])
    assert done["result"] == {"signal": "go", "payload": nested(LIMIT)}  # the kind wraps it: 65
    read = client.get(f"/api/v1/orgs/{org}/jobs/{job['id']}/result", headers=anna.auth)
    assert read.status_code == 200 and read.get_json()["result"]["payload"] == nested(LIMIT)


# -- params ------------------------------------------------------------------------------------

def test_params_nested_past_the_limit_are_refused_and_write_no_job(stack: Stack, client, people):
    org, anna = people
    before = stack.count_jobs(org)
    jobs, batch = f"/api/v1/orgs/{org}/jobs", f"/api/v1/orgs/{org}/jobs:batch"
    assert_refused(post_json(client, jobs, params_text(100), anna))
    assert_refused(post_json(client, jobs, params_text(LIMIT + 1), anna), "params")
    assert_refused(post_json(client, batch, '{"jobs": [' + params_text(100) + "]}", anna))
    refused = assert_refused(post_json(client, batch, '{"jobs": [{"kind": "bench.noop"}, '
                                       + params_text(LIMIT + 1) + "]}", anna), "params")
    assert refused["index"] == 1
    step = '{"name": "a", "kind": "test.echo", "params": {"data": ' + nested_text(LIMIT) + "}}"
    assert_refused(post_json(client, jobs, '{"kind": "workflow", "params": {"steps": [' + step + "]}}",
                             anna), "steps")
    assert stack.count_jobs(org) == before


def test_params_at_the_limit_are_accepted_and_come_back_whole(stack: Stack, client, people):
    """A job's params, a batch's, and a workflow step's (the deepest a body carries: 70 levels
    of the body), each at the limit: accepted, run, and their results read back."""
    org, anna = people
    jobs, batch = f"/api/v1/orgs/{org}/jobs", f"/api/v1/orgs/{org}/jobs:batch"
    one = post_json(client, jobs, params_text(LIMIT), anna)
    assert one.status_code == 202, one.get_json()
    many = post_json(client, batch, '{"jobs": [' + params_text(LIMIT) + "]}", anna)
    assert many.status_code == 202, many.get_json()
    step = '{"name": "a", "kind": "test.echo", "params": {"data": ' + nested_text(LIMIT - 1) + "}}"
    workflow = '{"kind": "workflow", "params": {"steps": [' + step + "]}}"
    flow = post_json(client, jobs, workflow, anna)
    assert flow.status_code == 202, flow.get_json()
    flows = post_json(client, batch, '{"jobs": [' + workflow + "]}", anna)
    assert flows.status_code == 202, flows.get_json()
    for job_id in (one.get_json()["id"], many.get_json()["jobs"][0]["id"]):
        done = stack.wait_for(job_id, "completed", "failed")
        assert done["status"] == "completed", (done["error_code"], done["error_message"])
        assert done["result"] == {"data": nested(LIMIT - 1)}
    for job_id in (flow.get_json()["id"], flows.get_json()["jobs"][0]["id"]):
        done = stack.wait_for(job_id, "completed", "failed")
        assert done["status"] == "completed", (done["error_code"], done["error_message"])
        assert done["result"]["steps"]["a"] == {"data": nested(LIMIT - 1)}
        read = client.get(f"/api/v1/orgs/{org}/jobs/{job_id}/result", headers=anna.auth)
        assert read.status_code == 200


# -- uploads -----------------------------------------------------------------------------------

def test_an_import_file_nested_100_deep_is_refused_on_the_page_and_writes_no_job(stack: Stack, app,
                                                                                  people):
    org, anna = people
    browser = app.test_client()
    sign_in(browser, anna)
    csrf = csrf_of(browser.get(f"/orgs/{org}/jobs"))
    before = stack.count_jobs(org)
    for depth in (100, LIMIT + 1):
        content = '{"projects": [{"name": "x", "description": ' + nested_text(depth - 3) + "}]}"
        answer = browser.post(f"/orgs/{org}/jobs", content_type="multipart/form-data", headers=HTML,
                              data={"kind": "projects_import", "csrf": csrf,
                                    "file": (io.BytesIO(content.encode()), "projects.json")})
        assert answer.status_code == 400, answer.status_code
        problem = PROBLEM.search(answer.get_data(as_text=True))
        assert problem and f"{LIMIT} levels" in problem.group(1), problem
    assert stack.count_jobs(org) == before


# -- the Python API ----------------------------------------------------------------------------

def refused(call) -> DomainError:
    with pytest.raises(InvalidRequest) as failure:
        call()
    assert f"{LIMIT} levels" in failure.value.message or "MiB" in failure.value.message
    return failure.value


@pytest.mark.parametrize("depth", [LIMIT + 1, 100_000])
def test_the_python_api_refuses_deep_params_and_payloads_and_writes_nothing(stack: Stack, people,
                                                                          depth):
    org, anna = people
    jobs = stack.jobs
    with stack.app_db.begin() as conn:
        waiting = jobs.submit(conn, "bench.await_signal", {"name": "go", "timeout": 60},
                              organization_id=org, requested_by=anna.id).job
    before = stack.count_jobs(org)
    deep = {"data": nested(depth - 1)}
    with stack.app_db.begin() as conn:
        error = refused(lambda: jobs.submit(conn, "test.echo", deep, organization_id=org,
                                            requested_by=anna.id))
        assert error.details["fields"] == ["params"]
        batch = [JobRequest("bench.noop"), JobRequest("test.echo", deep)]
        error = refused(lambda: jobs.submit_many(conn, batch, organization_id=org,
                                                 requested_by=anna.id))
        assert error.details["index"] == 1
        canvas = chain(sig("bench.noop"), sig("test.echo", **deep))
        error = refused(lambda: jobs.submit_workflow(conn, canvas, organization_id=org,
                                                     requested_by=anna.id))
        assert error.details["fields"] == ["steps"] and error.details["step"] == 1
        member = jobs.member(conn, org, anna.id)
        error = refused(lambda: jobs.signal(conn, member, waiting.id, "go", nested(depth)))
        assert error.details["fields"] == ["payload"]
    assert stack.count_jobs(org) == before and signals_of(stack, waiting.id) == 0
    with stack.app_db.begin() as conn:
        jobs.cancel(conn, jobs.member(conn, org, anna.id), waiting.id)


def test_the_python_api_takes_values_at_the_limit_and_params_up_to_their_size(stack: Stack, people):
    org, anna = people
    jobs = stack.jobs
    with stack.app_db.begin() as conn:
        at_limit = jobs.submit(conn, "test.echo", {"data": nested(LIMIT - 1)}, organization_id=org,
                               requested_by=anna.id).job
        flow = jobs.submit_workflow(conn, chain(sig("test.echo", data=nested(LIMIT - 1))),
                                    organization_id=org, requested_by=anna.id).job
        error = refused(lambda: jobs.submit(conn, "test.echo", {"data": "x" * 1024 * 1024},
                                            organization_id=org, requested_by=anna.id))
        assert error.details["fields"] == ["params"]
    assert stack.jobs.wait(at_limit.id, 20, organization_id=org).result == {"data": nested(LIMIT - 1)}
    outcome = stack.jobs.wait(flow.id, 20, organization_id=org)
    assert outcome.job.status == "completed"


# -- what a kind writes ------------------------------------------------------------------------

@pytest.mark.parametrize("into", ["result", "step"])
def test_a_kind_writing_a_value_past_its_limit_fails_at_once_with_a_clear_error(stack: Stack, client,
                                                                                 people, into):
    org, anna = people
    for depth in (WRAPPED + 1, 950):
        job = submit(client, org, anna, "test.nested", {"depth": depth, "into": into})
        done = stack.wait_for(job["id"], "completed", "failed")
        assert (done["status"], done["error_code"], done["attempts"]) == (
            "failed", "result_not_storable", 1), done["error_message"]
        assert f"{WRAPPED} levels" in done["error_message"]
    job = submit(client, org, anna, "test.nested", {"depth": WRAPPED, "into": into})
    done = stack.wait_for(job["id"], "completed", "failed")
    assert done["status"] == "completed", (done["error_code"], done["error_message"])
    if into == "result":
        assert done["result"] == nested(WRAPPED)
