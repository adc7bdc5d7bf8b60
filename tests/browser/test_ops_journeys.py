"""An operator's journey through the dashboard, in Chromium, against real worker processes:
the overview scans in one screen at 1280 px, says when every slot is busy, and its reload does
not wipe a form being typed into.

``SPACEJOBS_DOCS_SCREENSHOTS=1`` also writes the overview's picture to docs/dashboard.png (how
the picture of docs/guides/operations.md is made)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import Live
from tests.conftest import submit
from tests.kit.stack import Stack

pytestmark = [pytest.mark.browser, pytest.mark.slow]
DOCS = Path(__file__).resolve().parents[2] / "docs"
#: the overview's height at 1280 px before it was a table: 3,760 px with 18 kinds
CARDS_HEIGHT = 3760


def sign_in(page: Page, live: Live, email: str, password: str) -> None:
    page.goto(live.url + "/login")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()


def test_the_overview_scans_in_one_screen_says_every_slot_is_busy_and_keeps_a_typed_form(
        stack: Stack, live: Live, page: Page, shots: Path):
    client = live.app.test_client()
    tenants = [stack.user(live.demo[email]["org_id"], role="owner")
               for email in ("anna@acme.example", "anna@globex.example")]
    org_ids = [live.demo[email]["org_id"] for email in ("anna@acme.example", "anna@globex.example")]
    for org, owner in zip(org_ids, tenants, strict=True):
        for _ in range(6):
            submit(client, org, owner, "bench.noop")
    for org, owner in zip(org_ids, tenants, strict=True):
        stack.wait_for(submit(client, org, owner, "bench.noop")["id"], "completed", timeout=30)
    # Two long jobs hold the stack's only two slots; a third waits for one.
    long_jobs = [submit(client, org, owner, "bench.sleep", {"seconds": 40})
                 for org, owner in zip(org_ids, tenants, strict=True)]
    for job in long_jobs:
        stack.wait_for(job["id"], "leased", timeout=30)
    submit(client, org_ids[0], tenants[0], "bench.sleep", {"seconds": 1})

    page.set_viewport_size({"width": 1280, "height": 900})
    olga = live.demo["olga@ops.example"]
    sign_in(page, live, olga["email"], olga["password"])
    page.goto(live.url + "/ops")
    expect(page.get_by_text("Every slot is busy")).to_be_visible(timeout=20_000)
    expect(page.locator("#slots")).to_contain_text("2 of 2 running")
    # A compact table, the busiest kinds first; the idle and child-only kinds folded away.
    kinds = page.locator("table.kinds").first.locator("tr[data-kind]")
    assert kinds.count() >= 2
    first = kinds.first.get_attribute("data-kind")
    assert first in ("bench.noop", "bench.sleep")
    expect(page.locator("details#idle-kinds")).not_to_have_attribute("open", "")
    expect(page.locator("details#idle-kinds tr[data-kind='projects_export']")).to_be_hidden()
    expect(page.locator("details#child-only-kinds")).to_contain_text("Child-only kinds")
    # The chart says what it shows.
    chart = page.locator("figure.chart svg")
    expect(chart).to_contain_text("jobs/min")
    expect(chart).to_contain_text("completed")
    # Names beside ids.
    expect(page.locator("h2:has-text('Running') + table")).to_contain_text("Acme Rockets")
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height < CARDS_HEIGHT / 2, height
    page.screenshot(path=shots / "ops-overview.png", full_page=False)
    if os.environ.get("SPACEJOBS_DOCS_SCREENSHOTS", "0") not in ("", "0"):
        shutil.copy(shots / "ops-overview.png", DOCS / "dashboard.png")

    # A rate limit being typed survives the 5 s reloads: the page waits for the form.
    page.evaluate("window.__sameDocument = true")
    page.select_option("select[name=organization_id]", label=page.locator(
        "select[name=organization_id] option", has_text="Globex Orbital").first.inner_text())
    limit = page.get_by_placeholder("50 per 10 seconds")
    limit.fill("5 per 6")
    page.wait_for_timeout(7_000)
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded over the form"
    expect(limit).to_have_value("5 per 6")
    expect(page.locator("#refresh-note")).to_have_text("refresh paused while you use a form")
    limit.fill("5 per 60 seconds")
    page.get_by_role("button", name="Set rate limit").click()
    expect(page.locator("#rate-limits + p + table")).to_contain_text("Globex Orbital")
    expect(page.locator("#rate-limits + p + table")).to_contain_text("5 per 60 s")
    # Left alone, the page reloads itself again.
    page.evaluate("window.__sameDocument = true")
    page.wait_for_timeout(6_500)
    assert not page.evaluate("window.__sameDocument === true"), "the page stopped refreshing"


def test_a_workflows_steps_are_listed_under_it_with_names_beside_ids(
        stack: Stack, live: Live, page: Page, shots: Path):
    org = live.demo["anna@acme.example"]["org_id"]
    owner = stack.user(org, role="owner")
    client = live.app.test_client()
    report = submit(client, org, owner, "projects_report", {})
    stack.wait_for(report["id"], "completed", timeout=60)

    page.set_viewport_size({"width": 1280, "height": 720})
    olga = live.demo["olga@ops.example"]
    sign_in(page, live, olga["email"], olga["password"])
    page.goto(live.url + "/ops/jobs")
    page.select_option("select[name=organization_id]", value=str(org))
    page.get_by_role("button", name="Filter").click()
    workflow = page.locator(f"tr.top[data-job='{report['id']}']")
    expect(workflow).to_contain_text("Acme Rockets")
    expect(workflow).to_contain_text(owner.email)
    steps = page.locator(f"tr.step[data-parent='{report['id']}']")
    assert steps.count() >= 2
    # Right under their workflow: the line that counts them, then the steps.
    expect(workflow.locator("xpath=following-sibling::tr[1]")).to_contain_text(
        f"{steps.count()} steps: {steps.count()} completed")
    page.screenshot(path=shots / "ops-jobs.png", full_page=False)
    if os.environ.get("SPACEJOBS_DOCS_SCREENSHOTS", "0") not in ("", "0"):
        shutil.copy(shots / "ops-jobs.png", DOCS / "ops-jobs.png")
