"""A kind started and answered from the pages, through Flask's test client against a real
database and real workers: the Jobs page's form made from the kind's params model, refused in
the API's words with what was typed kept; a waiting job's page offering the signals its kind
declares to whoever may send them, by the API's own rule, the database naming the sender."""

from __future__ import annotations

import html

import pytest

from tests.conftest import csrf_of, sign_in
from tests.kit.stack import Stack

PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def people(stack: Stack):
    """An organization with an owner, an admin and a plain member who can all sign in."""
    org = stack.org("Approvals")
    return org, {role: stack.user(org, role=role, password=PASSWORD)
                 for role in ("owner", "admin", "member")}


def browser_of(app, person):  # type: ignore[no-untyped-def]
    browser = app.test_client()
    sign_in(browser, person)
    return browser


def text_of(answer) -> str:  # type: ignore[no-untyped-def]
    return html.unescape(answer.get_data(as_text=True))


def start(browser, org, data: dict):  # type: ignore[no-untyped-def]
    page = browser.get(f"/orgs/{org}/jobs")
    return browser.post(f"/orgs/{org}/jobs", data={"csrf": csrf_of(page), **data})


def test_the_jobs_page_makes_each_form_from_the_kinds_params_model(stack: Stack, app, people):
    org, person = people
    page = text_of(browser_of(app, person["admin"]).get(f"/orgs/{org}/jobs"))
    # the kind's label, description, and one labelled input per field with its bounds and default
    assert "<h2>Approval (demo)</h2>" in page
    assert 'for="start-demo-approval-request">What needs approving<' in page
    assert 'name="hours" type="number" step="1" min="1" max="168"' in page
    assert 'value="24"' in page and "Without an answer by then, the job fails." in page
    # each card says what its kind makes, from the kind's own description
    assert "A ZIP file of every project of this organization" in page
    assert "A JSON file of every project of this organization." in page


def test_bad_input_is_refused_in_the_apis_words_and_what_was_typed_stays(stack: Stack, app,
                                                                        people):
    org, person = people
    browser = browser_of(app, person["admin"])
    refused = start(browser, org, {"kind": "demo.approval", "request": "Launch Vostok 7",
                                   "hours": "500"})
    api = app.test_client().post(f"/api/v1/orgs/{org}/jobs", headers=person["admin"].auth,
                                 json={"kind": "demo.approval",
                                       "params": {"request": "Launch Vostok 7", "hours": "500"}})
    assert refused.status_code == api.status_code == 400
    page = text_of(refused)
    assert api.get_json()["error"]["message"] in page  # the very same sentence
    assert 'value="Launch Vostok 7"' in page and 'value="500"' in page
    assert 'id="start-demo-approval-hours"' in page and 'aria-invalid="true"' in page


def test_a_kind_is_started_from_the_pages_only_by_whom_its_rules_allow(stack: Stack, app, people):
    org, person = people
    member = browser_of(app, person["member"])
    page = text_of(member.get(f"/orgs/{org}/jobs"))
    assert "Approval (demo) needs the admin role; yours here is member." in page
    refused = start(member, org, {"kind": "demo.approval", "request": "x"})
    assert refused.status_code == 403
    # a kind not offered on the pages cannot be started through them, whatever the form says
    assert start(member, org, {"kind": "bench.noop"}).status_code == 404


def test_a_waiting_job_is_answered_from_its_page_by_whom_the_signal_rule_allows(
        stack: Stack, app, people):
    org, person = people
    admin, member = browser_of(app, person["admin"]), browser_of(app, person["member"])
    started = start(admin, org, {"kind": "demo.approval", "request": "Launch Vostok 7"})
    assert started.status_code == 302, text_of(started)
    page_url = started.headers["Location"]
    job_id = page_url.rsplit("/", 1)[1]
    stack.wait_for(job_id, "waiting")

    waiting = text_of(admin.get(page_url))
    assert "Waiting for the signal “answer”" in waiting
    assert "Send “answer”" in waiting and 'name="decision"' in waiting
    # a plain member who did not start it may not signal it: no form, the rule in words
    seen = text_of(member.get(page_url))
    assert "Send “answer”" not in seen
    assert ("Only the person who started this job, or a member with the admin role, may send it "
            "“answer”.") in seen
    sent = member.post(f"{page_url}/signals/answer",
                       data={"csrf": csrf_of(member.get(page_url)), "decision": "approve"})
    assert sent.status_code == 403
    # a payload its model refuses: the API's words, what was typed kept, nothing sent
    api = app.test_client().post(f"/api/v1/orgs/{org}/jobs/{job_id}/signals/answer",
                                 headers=person["admin"].auth, json={"comment": "looks good"})
    bad = admin.post(f"{page_url}/signals/answer",
                     data={"csrf": csrf_of(admin.get(page_url)), "comment": "looks good"})
    assert bad.status_code == api.status_code == 400
    assert api.get_json()["error"]["message"] == \
        "The fields of the signal “answer” are not valid: decision: required."
    assert api.get_json()["error"]["message"] in text_of(bad)
    assert ">looks good</textarea>" in text_of(bad)
    assert stack.job_row(job_id)["status"] == "waiting"

    answered = admin.post(f"{page_url}/signals/answer",
                          data={"csrf": csrf_of(admin.get(page_url)), "decision": "approve",
                                "comment": "Go for launch"})
    assert answered.status_code == 302
    stack.wait_for(job_id, "completed")
    result = app.test_client().get(f"/api/v1/orgs/{org}/jobs/{job_id}/result",
                                   headers=person["admin"].auth).get_json()["result"]
    # who answered is the database's record of the sender, not anything the form said
    assert result == {"request": "Launch Vostok 7", "decision": "approve",
                      "comment": "Go for launch", "answered_by": str(person["admin"].id),
                      "answerer_role": "admin"}
    done = text_of(admin.get(page_url))
    assert "Completed" in done and "Send “answer”" not in done


def test_a_signal_form_needs_the_csrf_token(stack: Stack, app, people):
    org, person = people
    admin = browser_of(app, person["admin"])
    started = start(admin, org, {"kind": "demo.approval", "request": "Forged?"})
    page_url = started.headers["Location"]
    stack.wait_for(page_url.rsplit("/", 1)[1], "waiting")
    forged = admin.post(f"{page_url}/signals/answer", data={"decision": "approve"})
    assert forged.status_code in (400, 403)
    assert stack.job_row(page_url.rsplit("/", 1)[1])["status"] == "waiting"
