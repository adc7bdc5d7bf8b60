"""A person starts a kind from its form, answers a waiting job from its page, and reads why a
job waits, in Chromium, against real worker processes. The pictures of docs/people.md that
show these are photographed here (``shots``)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, Route, expect

from spacejobs.models.kinds import RateLimit
from spacejobs.models.tenancy import accounts
from tests.browser.conftest import Live
from tests.browser.test_journeys import headline, mark_document, same_document, sign_in
from tests.kit.stack import Stack

pytestmark = pytest.mark.browser


def api(live: Live, person: dict, method: str, path: str, body: dict | None = None) -> dict:
    answer = live.app.test_client().open(f"/api/v1/orgs/{person['org_id']}{path}", method=method,
                                         json=body, headers={"Authorization": f"Bearer {person['token']}"})
    assert answer.status_code < 300, answer.get_json()
    return answer.get_json()


def test_an_owner_starts_an_approval_from_its_form_and_answers_it_on_its_page(
        stack: Stack, live: Live, page: Page, shots: Path):
    anna = live.demo["anna@acme.example"]
    sign_in(page, live, anna["email"], anna["password"])
    card = page.locator(".card", has=page.get_by_role("heading", name="Approval (demo)"))
    expect(card.get_by_label("Hours to answer")).to_have_value("24")  # the model's default
    # out of the model's bounds: the API's sentence, what was typed still there
    card.get_by_label("What needs approving").fill("Launch Vostok 7")
    card.get_by_label("Hours to answer").evaluate("input => input.removeAttribute('max')")
    card.get_by_label("Hours to answer").fill("500")
    card.get_by_role("button", name="Approval (demo)").click()
    expect(page.get_by_role("alert")).to_have_text(
        "The job parameters are not valid: hours: must be ≤ 168.")
    card = page.locator(".card", has=page.get_by_role("heading", name="Approval (demo)"))
    expect(card.get_by_label("What needs approving")).to_have_value("Launch Vostok 7")
    expect(card.get_by_label("Hours to answer")).to_have_value("500")
    card.get_by_label("Hours to answer").fill("2")
    card.get_by_role("button", name="Approval (demo)").click()

    expect(headline(page)).to_have_text("Waiting for the signal “answer”", timeout=15_000)
    expect(page.get_by_role("status")).to_have_text("Accepted. This page follows the job until it is done.")
    answer = page.get_by_role("form", name="Send “answer”")
    answer.get_by_label("Decision").select_option("approve")
    answer.get_by_label("Comment").fill("Go for launch")
    page.screenshot(path=shots / "13-approval-waiting.png", full_page=True)
    answer.get_by_role("button", name="Send “answer”").click()
    expect(headline(page)).to_have_text("Completed", timeout=15_000)
    # no notice says it is still on its way once it is done
    expect(page.locator(".notice")).to_have_count(0)
    result = api(live, anna, "GET", f"/jobs/{page.url.rsplit('/', 1)[1]}/result")["result"]
    assert (result["decision"], result["comment"], result["answerer_role"]) == \
        ("approve", "Go for launch", "owner")


def answer_typed_with_a_refresh_held(stack: Stack, live: Live, page: Page,
                                     person: dict) -> tuple[Locator, Route]:
    """An approval waiting for its answer, its page open with the script's fetches of the
    live part held until the test lets each go (a refresh that lands while a person types,
    made certain instead of left to timing), and an answer typed: (the form, the refresh)."""
    job = api(live, person, "POST", "/jobs", {"kind": "demo.approval",
                                              "params": {"request": "Refuel", "hours": 1}})
    stack.wait_for(job["id"], "waiting", timeout=15)
    sign_in(page, live, person["email"], person["password"])
    held: list[Route] = []

    def hold(route: Route) -> None:
        held.append(route)

    page.route("**/status", hold)
    page.goto(f"{live.url}/orgs/{person['org_id']}/jobs/{job['id']}")
    expect(headline(page)).to_have_text("Waiting for the signal “answer”")
    for _ in range(200):  # the events stream's first event asks for the part once
        if held:
            break
        page.wait_for_timeout(50)
    assert len(held) == 1, "the page never asked for its live part"
    answer = page.get_by_role("form", name="Send “answer”")
    answer.get_by_label("Decision").select_option("approve")
    answer.get_by_label("Comment").fill("Go for launch")
    answer.get_by_label("Comment").evaluate("field => { field.dataset.mark = 'typed here'; }")
    return answer, held[0]


def expect_the_answer_sent(page: Page, live: Live, person: dict) -> None:
    page.unroute("**/status")  # the next page's refreshes go through
    page.get_by_role("button", name="Send “answer”").click()
    expect(headline(page)).to_have_text("Completed", timeout=15_000)
    result = api(live, person, "GET", f"/jobs/{page.url.rsplit('/', 1)[1]}/result")["result"]
    assert (result["decision"], result["comment"]) == ("approve", "Go for launch")


def test_an_unchanged_live_part_leaves_the_answer_being_typed_alone(
        stack: Stack, live: Live, page: Page):
    anna = live.demo["anna@acme.example"]
    answer, refresh = answer_typed_with_a_refresh_held(stack, live, page, anna)
    # The page asks by the tag of what it shows; the server answers that nothing changed.
    fetched = refresh.fetch()
    assert fetched.status == 304
    refresh.fulfill(response=fetched)
    expect(page.locator("#job-status")).to_have_attribute("data-loads", "1")
    # the very field the person typed in, not a new one
    expect(answer.get_by_label("Comment")).to_have_attribute("data-mark", "typed here")
    expect(answer.get_by_label("Comment")).to_have_value("Go for launch")
    expect_the_answer_sent(page, live, anna)


def test_a_changed_live_part_keeps_what_was_typed_in_its_forms(
        stack: Stack, live: Live, page: Page):
    anna = live.demo["anna@acme.example"]
    answer, refresh = answer_typed_with_a_refresh_held(stack, live, page, anna)
    answer.get_by_label("Comment").focus()
    # The part as it would be had the job moved meanwhile: rendered again, a line added.
    fetched = refresh.fetch(headers={"Accept": "text/html"})  # no tag: the whole part
    assert fetched.status == 200
    refresh.fulfill(response=fetched, headers={**fetched.headers, "etag": '"moved"'},
                    body=fetched.text() + '<p id="moved">The job moved.</p>')
    expect(page.locator("#moved")).to_be_visible()
    expect(page.locator("#job-status")).to_have_attribute("data-loads", "1")
    comment = answer.get_by_label("Comment")
    expect(comment).not_to_have_attribute("data-mark", "typed here")  # a new field ...
    expect(comment).to_have_value("Go for launch")  # ... with what was typed in the old one
    expect(comment).to_be_focused()
    expect(answer.get_by_label("Decision")).to_have_value("approve")
    expect_the_answer_sent(page, live, anna)


def test_a_member_who_may_not_answer_reads_who_may_and_gets_no_form(
        stack: Stack, live: Live, page: Page):
    anna, vera = live.demo["anna@acme.example"], live.demo["vera@acme.example"]
    job = api(live, anna, "POST", "/jobs", {"kind": "demo.approval",
                                            "params": {"request": "Refuel", "hours": 1}})
    stack.wait_for(job["id"], "waiting", timeout=15)
    sign_in(page, live, vera["email"], vera["password"])
    # she may not start it either: the kind needs an admin
    expect(page.get_by_text("Approval (demo) needs the admin role; yours here is member.")).to_be_visible()
    page.goto(f"{live.url}/orgs/{vera['org_id']}/jobs/{job['id']}")
    expect(headline(page)).to_have_text("Waiting for the signal “answer”")
    expect(page.get_by_text("Only the person who started this job, or a member with the admin "
                            "role, may send it “answer”.")).to_be_visible()
    expect(page.get_by_role("button", name="Send “answer”")).to_have_count(0)
    api(live, anna, "POST", f"/jobs/{job['id']}/cancel")


def test_a_notice_leaves_when_the_job_moves_past_it(stack: Stack, live: Live, page: Page):
    anna = live.demo["anna@acme.example"]
    sign_in(page, live, anna["email"], anna["password"])
    page.get_by_label("Seconds it should take").fill("3")
    page.get_by_role("button", name="Slow export (demo)").click()
    notice = page.get_by_role("status").filter(has_text="Accepted.")
    expect(notice).to_be_visible()
    mark_document(page)
    expect(headline(page)).to_have_text("Completed", timeout=20_000)
    expect(notice).to_have_count(0)
    assert same_document(page)


def test_a_job_behind_a_rate_limit_says_until_when(stack: Stack, live: Live, page: Page,
                                                    shots: Path):
    anna = live.demo["anna@acme.example"]
    org = uuid.UUID(anna["org_id"])
    with stack.admin() as conn:
        accounts.set_rate_limit(conn, org, "projects_export", RateLimit.parse("1 per hour"))
    try:
        sign_in(page, live, anna["email"], anna["password"])
        page.get_by_role("button", name="Export projects").click()
        expect(headline(page)).to_have_text("Completed", timeout=20_000)
        page.get_by_role("link", name="← All jobs").click()
        page.get_by_role("button", name="Export projects").click()
        expect(headline(page)).to_contain_text("Queued — behind a rate limit until ")
        expect(page.get_by_text("As many jobs of this kind as its rate limit lets start")).to_be_visible()
        page.screenshot(path=shots / "14-rate-limited.png", full_page=True)
        page.get_by_role("link", name="← All jobs").click()
        expect(page.get_by_text("Queued behind its kind's rate limit until ")).to_be_visible()
        page.go_back()
        page.get_by_role("button", name="Cancel job").click()
        expect(headline(page)).to_have_text("Cancelled")
    finally:
        with stack.admin() as conn:
            accounts.set_rate_limit(conn, org, "projects_export", None)


def test_a_job_of_a_sequence_names_the_job_before_it_and_a_delayed_one_until_when(
        stack: Stack, live: Live, page: Page, shots: Path):
    anna = live.demo["anna@acme.example"]
    later = datetime.now(UTC) + timedelta(hours=2)
    key = f"nightly-{uuid.uuid4().hex[:6]}"
    first = api(live, anna, "POST", "/jobs", {"kind": "projects_export", "sequence_key": key,
                                              "run_after": later.isoformat()})
    second = api(live, anna, "POST", "/jobs", {"kind": "projects_export", "sequence_key": key})
    sign_in(page, live, anna["email"], anna["password"])
    page.goto(f"{live.url}/orgs/{anna['org_id']}/jobs/{second['id']}")
    expect(headline(page)).to_have_text(f"Queued — after job {first['id'][:8]} of its sequence")
    page.screenshot(path=shots / "15-sequence.png", full_page=True)
    page.get_by_role("link", name=f"job {first['id'][:8]}").click()
    expect(headline(page)).to_contain_text("Queued — delayed until ")
    for job in (first, second):
        api(live, anna, "POST", f"/jobs/{job['id']}/cancel")
