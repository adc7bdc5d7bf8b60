"""A person's journeys through the pages, in Chromium, against real worker processes.

Each state is photographed into pytest's tmp dir (the ``shots`` fixture); the best of them are
the pictures of docs/people.md.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import text

from spacejobs.demo.seed import ORGS
from spacejobs.models.jobs.canvas import Signature, chain, sig
from tests.browser.conftest import Live
from tests.kit.stack import Stack, wait_until

pytestmark = pytest.mark.browser
PASSWORD = "a long and careful password"


def sign_in(page: Page, live: Live, email: str, password: str) -> None:
    if "/login" not in page.url:
        page.goto(live.url + "/login")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()


def headline(page: Page):
    return page.locator("#job-headline")


def mark_document(page: Page) -> None:
    """A flag that only this very document carries: if it is still there later, the page
    changed by itself (the events stream), not by a reload."""
    page.evaluate("window.__sameDocument = true")


def same_document(page: Page) -> bool:
    return page.evaluate("window.__sameDocument === true")


@contextlib.contextmanager
def workers_frozen(stack: Stack) -> Iterator[None]:
    """Workers and beat stopped (SIGSTOP) between two transactions: a worker frozen inside one
    would hold the job's row lock, and the web's cancel would wait for it."""
    for _ in range(100):
        with stack.workers_paused():
            with stack.admin() as conn:
                busy = conn.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND usename = 'space_worker' AND state <> 'idle'")).scalar_one()
            if busy == 0:
                yield
                return
        time.sleep(0.03)
    raise AssertionError("the workers never paused outside a transaction")


def test_an_owner_exports_sees_queued_running_completed_live_and_downloads_the_file(
        stack: Stack, live: Live, page: Page, shots: Path):
    anna = live.demo["anna@acme.example"]
    sign_in(page, live, anna["email"], anna["password"])
    expect(page.get_by_role("heading", name="Jobs of Acme Rockets")).to_be_visible()
    assert page.url.endswith(f"/orgs/{anna['org_id']}/jobs")

    with workers_frozen(stack):
        page.get_by_label("Seconds it should take").fill("4")
        page.get_by_role("button", name="Slow export (demo)").click()
        expect(headline(page)).to_have_text("Queued — accepted, not started yet")
        mark_document(page)
        page.screenshot(path=shots / "1-queued.png")
    expect(headline(page)).to_contain_text("Running — ", timeout=15_000)
    # A measured total: the bar appears, and the words say the same without colour.
    expect(page.locator("progress#job-progress")).to_be_visible(timeout=15_000)
    expect(headline(page)).to_contain_text(re.compile(r"Running — writing the file \d+/8"))
    page.screenshot(path=shots / "2-running.png")
    expect(headline(page)).to_have_text("Completed", timeout=20_000)
    assert same_document(page), "the page reloaded instead of following the events stream"
    page.screenshot(path=shots / "3-completed.png")

    with page.expect_download() as download:
        page.get_by_role("link", name="Download the result").click()
    assert download.value.suggested_filename.startswith("demo-slow_export-")
    exported = json.loads(Path(download.value.path()).read_text())
    assert sorted(p["name"] for p in exported["projects"]) == sorted(ORGS["Acme Rockets"])

    # The plain export, from the same page: done in a blink, the same file.
    page.get_by_role("link", name="← All jobs").click()
    page.get_by_role("button", name="Export projects").click()
    expect(headline(page)).to_have_text("Completed", timeout=20_000)
    with page.expect_download() as download:
        page.get_by_role("link", name="Download the result").click()
    assert download.value.suggested_filename.startswith("projects_export-")
    assert json.loads(Path(download.value.path()).read_text())["projects"] == exported["projects"]
    page.get_by_role("link", name="← All jobs").click()
    expect(page.get_by_role("cell", name="Completed")).to_have_count(2)
    page.screenshot(path=shots / "4-jobs.png", full_page=True)


def test_when_its_stream_is_refused_the_job_page_follows_the_job_by_reloading(
        stack: Stack, live: Live, page: Page):
    """Over the events stream caps the server answers 429 too_many_streams; the page then does
    what it does without JavaScript, and still reaches the end."""
    streams = live.app.extensions["spacejobs.streams"]
    anna = live.demo["anna@acme.example"]
    sign_in(page, live, anna["email"], anna["password"])
    streams.per_credential = 0
    try:
        with workers_frozen(stack):
            page.get_by_role("button", name="Export projects").click()
            expect(headline(page)).to_have_text("Queued — accepted, not started yet")
            mark_document(page)
        expect(headline(page)).to_have_text("Completed", timeout=20_000)
        assert not same_document(page), "a refused stream cannot have updated the page in place"
    finally:
        streams.per_credential = 2


def test_a_slow_job_is_cancelled_first_requested_then_done(stack: Stack, live: Live, page: Page, shots: Path):
    vera = live.demo["vera@acme.example"]  # a plain member may stop a job she started
    sign_in(page, live, vera["email"], vera["password"])
    page.get_by_label("Seconds it should take").fill("120")
    page.get_by_role("button", name="Slow export (demo)").click()
    expect(headline(page)).to_contain_text("Running — ", timeout=15_000)
    with workers_frozen(stack):  # a frozen worker cannot stop: the request stays a request
        page.get_by_role("button", name="Cancel job").click()
        expect(headline(page)).to_have_text("Cancel requested")
        expect(page.get_by_role("status").filter(has_text="Cancel requested")).to_contain_text(
            "stops at its next safe point")
        expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)
        mark_document(page)
        page.screenshot(path=shots / "5-cancel-requested.png")
    expect(headline(page)).to_have_text("Cancelled", timeout=15_000)
    assert same_document(page)
    page.screenshot(path=shots / "6-cancelled.png")


def test_a_workflows_page_follows_its_steps_live(stack: Stack, live: Live, page: Page, shots: Path):
    """Each step's status changes in place as the step moves, even where the workflow itself
    does not change (a step that starts running), and each step links to its own page."""
    anna = live.demo["anna@acme.example"]
    org = anna["org_id"]
    with stack.admin() as conn:
        owner = conn.execute(text("SELECT id FROM users WHERE email = :email"),
                             {"email": anna["email"]}).scalar_one()
    with stack.app_db.begin() as conn:
        job = stack.jobs.submit_workflow(conn, chain(
            sig("bench.noop", name="Collect the projects"),
            Signature("bench.await_signal", {"name": "approved", "timeout": 3600}, "Approval"),
            sig("bench.sleep", seconds=8, name="Write the report")),
            organization_id=org, requested_by=owner).job
    sign_in(page, live, anna["email"], anna["password"])
    page.goto(f"{live.url}/orgs/{org}/jobs/{job.id}")

    def step(name: str):
        return page.get_by_role("row").filter(has=page.get_by_role("cell", name=name, exact=True))

    expect(step("Approval")).to_contain_text("Waiting", timeout=15_000)
    expect(step("Collect the projects")).to_contain_text("Completed")
    expect(step("Write the report")).to_contain_text("Not started")
    expect(page.get_by_role("heading", name="Its steps (3)")).to_be_visible()
    mark_document(page)
    page.screenshot(path=shots / "11-workflow-steps-waiting.png", full_page=True)

    approval = step("Approval").get_by_role("link").get_attribute("href")
    step_id = approval.rsplit("/", 1)[1]
    sent = live.app.test_client().post(f"/api/v1/orgs/{org}/jobs/{step_id}/signals/approved",
                                       json={"ok": True},
                                       headers={"Authorization": f"Bearer {anna['token']}"})
    assert sent.status_code == 202
    # The report step starting changes nothing of the workflow: the list shows it all the same.
    expect(step("Write the report")).to_contain_text("Running", timeout=15_000)
    expect(step("Approval")).to_contain_text("Completed")
    page.screenshot(path=shots / "12-workflow-steps-running.png", full_page=True)
    expect(step("Write the report")).to_contain_text("Completed", timeout=20_000)
    expect(headline(page)).to_have_text("Completed", timeout=15_000)
    assert same_document(page), "the page reloaded instead of following the steps in place"
    wait_until(lambda: page.locator("[data-steps-live]").get_attribute("data-steps-live") == "no",
               10, what="the list saying nothing moves any more")

    step("Approval").get_by_role("link").click()
    expect(headline(page)).to_have_text("Completed")
    assert page.url.endswith(approval)


def test_a_member_removed_while_browsing_gets_404_on_the_next_click(
        stack: Stack, live: Live, page: Page, shots: Path):
    org = live.demo["anna@acme.example"]["org_id"]
    member = stack.user(org, role="member", password=PASSWORD)
    sign_in(page, live, member.email, PASSWORD)
    expect(page.get_by_role("heading", name="Jobs of Acme Rockets")).to_be_visible()
    stack.remove_member(org, member.id)
    with page.expect_response(re.compile(r"/projects$")) as answer:
        page.get_by_role("link", name="Projects", exact=True).click()
    assert answer.value.status == 404
    expect(page.get_by_role("heading", name="Not found")).to_be_visible()
    expect(page.get_by_text("Rockets")).to_have_count(0)  # not even the organization's name
    page.screenshot(path=shots / "7-removed-member-404.png")


def test_a_read_only_organization_explains_why_import_is_unavailable(
        stack: Stack, live: Live, page: Page, shots: Path):
    org = stack.org("Archive Orbital", state="read_only")
    owner = stack.user(org, role="owner", password=PASSWORD)
    sign_in(page, live, owner.email, PASSWORD)
    expect(page.get_by_text("Import projects is unavailable: this organization is read-only")).to_be_visible()
    expect(page.get_by_label("JSON file to import")).to_have_count(0)
    expect(page.get_by_role("button", name="Export projects")).to_be_visible()  # data may always leave
    page.screenshot(path=shots / "8-read-only.png", full_page=True)
    page.get_by_role("link", name="Projects", exact=True).click()
    refusal = "Creating a project is unavailable: this organization is read-only"
    expect(page.get_by_text(refusal)).to_be_visible()
    expect(page.get_by_label("Name")).to_have_count(0)


def test_a_wrong_password_is_refused_and_repeated_attempts_are_throttled(
        stack: Stack, live: Live, page: Page, shots: Path):
    person = stack.user(stack.org(), role="member", password=PASSWORD)
    page.goto(live.url + "/")
    assert page.url.endswith("/login")
    for _ in range(3):  # the live app allows 3 failures per account per minute
        sign_in(page, live, person.email, "not my password")
        expect(page.get_by_role("alert")).to_have_text("That email and password do not match an account.")
    page.screenshot(path=shots / "9-wrong-password.png")
    sign_in(page, live, person.email, PASSWORD)  # the right one, too late
    expect(page.get_by_role("alert")).to_have_text(
        "Too many sign-in attempts. Wait a minute, then try again.")
    page.screenshot(path=shots / "10-throttled.png")
