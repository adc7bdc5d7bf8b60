"""The pages for people, through Flask's test client against a real database and real workers:
sign-in, the organization's projects and jobs, the live job page, cancel and download."""

from __future__ import annotations

import io
import json
import re

import pytest

from tests.conftest import csrf_of, sign_in, submit
from tests.kit.stack import Stack, wait_until

PASSWORD = "correct horse battery staple"
HTML = {"Accept": "text/html"}


@pytest.fixture()
def browser(app):
    return app.test_client()


@pytest.fixture(scope="module")
def acme(stack: Stack):
    """An organization with an owner, an admin and a plain member who can all sign in."""
    org = stack.org("Acme")
    people = {role: stack.user(org, role=role, password=PASSWORD) for role in ("owner", "admin", "member")}
    return org, people


def test_the_root_sends_strangers_to_sign_in_and_members_to_their_organizations_jobs(
        stack: Stack, browser, acme):
    org, people = acme
    assert browser.get("/").headers["Location"] == "/login"
    assert sign_in(browser, people["member"]).headers["Location"] == f"/orgs/{org}/jobs"
    assert browser.get("/").headers["Location"] == f"/orgs/{org}/jobs"
    page = browser.get(f"/orgs/{org}/jobs")
    assert page.status_code == 200
    assert "Jobs of Acme" in page.get_data(as_text=True)


def test_a_page_without_a_session_asks_to_sign_in_and_comes_back_after(stack: Stack, browser, acme):
    org, people = acme
    answer = browser.get(f"/orgs/{org}/projects?x=1")
    assert answer.status_code == 302
    assert answer.headers["Location"].startswith("/login?next=")
    login = browser.get(answer.headers["Location"])
    back = browser.post("/login", data={"email": people["owner"].email, "password": PASSWORD,
                                        "csrf": csrf_of(login), "next": f"/orgs/{org}/projects?x=1"})
    assert back.headers["Location"] == f"/orgs/{org}/projects?x=1"


# ----------------------------------------------------------------------------- sign-in

def test_a_wrong_password_and_an_unknown_email_are_refused_alike_and_start_no_session(
        stack: Stack, browser, acme):
    _org, people = acme
    for email, password in ((people["owner"].email, "not the password"), ("nobody@example.test", PASSWORD)):
        answer = browser.post("/login", data={"email": email, "password": password,
                                              "csrf": csrf_of(browser.get("/login"))})
        assert answer.status_code == 401
        assert "That email and password do not match an account." in answer.get_data(as_text=True)
        assert browser.get("/").headers["Location"] == "/login"


@pytest.mark.parametrize("target", [
    "https://evil.example/", "//evil.example/x", "/\\evil.example", "\\\\evil.example",
    "javascript:alert(1)", "http:/evil.example", "/\r\nLocation: https://evil.example",
    "/\tevil", "evil.example",
])
def test_a_next_that_leaves_the_site_is_ignored(stack: Stack, browser, acme, target):
    org, people = acme
    answer = sign_in(browser, people["owner"], next=target)
    assert answer.headers["Location"] == f"/orgs/{org}/jobs"
    # and once signed in, GET /login?next=… does not bounce there either
    assert browser.get("/login", query_string={"next": target}).headers["Location"] == f"/orgs/{org}/jobs"


def test_operators_land_on_the_dashboard_and_members_never_see_it(stack: Stack, browser, acme):
    operator = stack.operator()
    with stack.admin() as conn:
        from spacejobs.models.tenancy import passwords
        passwords.set_password(conn, operator.id, PASSWORD)
    operator.password = PASSWORD
    assert sign_in(browser, operator).headers["Location"] == "/ops"
    assert browser.get("/ops").status_code == 200
    member_browser = stack.make_app().test_client()
    sign_in(member_browser, acme[1]["owner"])
    assert member_browser.get("/ops").status_code == 404


def test_a_session_opens_no_json_endpoint_but_the_events_stream(stack: Stack, app, acme):
    org, people = acme
    job = submit(app.test_client(), org, people["owner"], "bench.noop")
    stack.wait_for(job["id"], "completed")
    browser = app.test_client()
    sign_in(browser, people["owner"])
    for method, url in (("GET", "/api/v1/me"), ("GET", f"/api/v1/orgs/{org}/jobs"),
                        ("GET", f"/api/v1/orgs/{org}/projects"),
                        ("GET", f"/api/v1/orgs/{org}/jobs/{job['id']}"),
                        ("GET", f"/api/v1/orgs/{org}/jobs/{job['id']}/result"),
                        ("POST", f"/api/v1/orgs/{org}/jobs"),
                        ("POST", f"/api/v1/orgs/{org}/jobs/{job['id']}/cancel")):
        assert browser.open(url, method=method, json={"kind": "bench.noop"}).status_code == 401, url
    assert browser.get(f"/api/v1/orgs/{org}/jobs/{job['id']}/events").status_code == 200


# ----------------------------------------------------------------------------- projects

def test_projects_are_listed_and_created_and_a_read_only_organization_says_why_not(stack: Stack, app):
    org = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    browser = app.test_client()
    sign_in(browser, owner)
    page = browser.get(f"/orgs/{org}/projects")
    created = browser.post(f"/orgs/{org}/projects", data={"name": "Apollo", "description": "Moon",
                                                         "csrf": csrf_of(page)})
    assert created.status_code == 302
    listing = browser.get(f"/orgs/{org}/projects").get_data(as_text=True)
    assert "Apollo" in listing and "Moon" in listing

    stack.set_state(org, "read_only")
    page = browser.get(f"/orgs/{org}/projects")
    text = page.get_data(as_text=True)
    assert "Creating a project is unavailable: this organization is read-only" in text
    assert 'name="name"' not in text  # no form to fill in for nothing
    refused = browser.post(f"/orgs/{org}/projects", data={"name": "Gemini", "csrf": csrf_of(page)})
    assert refused.status_code == 409
    assert "this organization is read-only" in refused.get_data(as_text=True)
    assert "Gemini" not in browser.get(f"/orgs/{org}/projects").get_data(as_text=True)
    stack.set_state(org, "deleting")
    assert "this organization is being deleted" in browser.get(f"/orgs/{org}/projects").get_data(as_text=True)


# ----------------------------------------------------------------------------- jobs

def test_export_from_the_jobs_page_runs_and_its_file_downloads_to_members(stack: Stack, app):
    org = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    member = stack.user(org, role="member", password=PASSWORD)
    client = app.test_client()
    client.post(f"/api/v1/orgs/{org}/projects", json={"name": "Vostok"}, headers=owner.auth)
    browser = app.test_client()
    sign_in(browser, owner)
    page = browser.get(f"/orgs/{org}/jobs")
    started = browser.post(f"/orgs/{org}/jobs", data={"kind": "projects_export", "csrf": csrf_of(page)})
    assert started.status_code == 302
    job_id = started.headers["Location"].rsplit("/", 1)[1]
    first = browser.get(started.headers["Location"]).get_data(as_text=True)
    # the notice holds while the job is not done, and is not shown above a job that already is
    shown_status = re.search(r'data-status="([a-z_]+)"', first)
    assert shown_status is not None
    assert ("Accepted. This page follows the job until it is done." in first) == \
        (shown_status.group(1) in ("queued", "leased", "waiting"))
    stack.wait_for(job_id, "completed")
    done = browser.get(f"/orgs/{org}/jobs/{job_id}/status").get_data(as_text=True)
    assert "Completed" in done and "Download the result" in done

    download = browser.get(f"/orgs/{org}/jobs/{job_id}/download")
    assert download.status_code == 200
    assert download.headers["Content-Disposition"].startswith('attachment; filename="projects_export-')
    assert [p["name"] for p in json.loads(download.data)["projects"]] == ["Vostok"]

    # The list shows who started it, when, and attempts, newest first.
    listing = browser.get(f"/orgs/{org}/jobs").get_data(as_text=True)
    assert "Export projects" in listing and "1 of 3" in listing and owner.email in listing

    # Only CURRENT members: once removed, the same URL is the stranger's 404.
    other = app.test_client()
    sign_in(other, member)
    assert other.get(f"/orgs/{org}/jobs/{job_id}/download").status_code == 200
    stack.remove_member(org, member.id)
    gone = other.get(f"/orgs/{org}/jobs/{job_id}/download", headers=HTML)
    stranger = app.test_client()
    sign_in(stranger, stack.user(stack.org(), role="owner", password=PASSWORD))
    assert (gone.status_code, gone.data) == (404, stranger.get(f"/orgs/{org}/jobs/{job_id}/download",
                                                                 headers=HTML).data)


def test_import_takes_a_json_file_checked_by_the_apis_own_rules(stack: Stack, app):
    org = stack.org()
    admin = stack.user(org, role="admin", password=PASSWORD)
    browser = app.test_client()
    sign_in(browser, admin)

    def upload(content: bytes, name: str = "projects.json"):
        page = browser.get(f"/orgs/{org}/jobs")
        return browser.post(f"/orgs/{org}/jobs", content_type="multipart/form-data", data={
            "kind": "projects_import", "csrf": csrf_of(page), "file": (io.BytesIO(content), name)})

    api_answer = app.test_client().post(f"/api/v1/orgs/{org}/jobs", headers=admin.auth, json={
        "kind": "projects_import", "params": {"projects": [{"nom": "x"}]}}).get_json()
    refused = upload(json.dumps({"projects": [{"nom": "x"}]}).encode())
    assert refused.status_code == 400
    assert api_answer["error"]["message"] in refused.get_data(as_text=True)  # the very same sentence
    broken = upload(b'{"projects": [')
    assert broken.status_code == 400 and "The file is not valid JSON (line 1" in broken.get_data(as_text=True)
    assert upload(b"\xff\xfe").status_code == 400

    accepted = upload(json.dumps({"projects": [{"name": f"P{i}"} for i in range(120)]}).encode())
    assert accepted.status_code == 302
    job_id = accepted.headers["Location"].rsplit("/", 1)[1]
    row = stack.wait_for(job_id, "completed")
    # Measured per batch: 50 + 50 + 20.
    assert row["progress"] == {"stage": "importing projects", "done": 120, "total": 120}
    assert row["result"]["imported"] == 120


def test_each_button_is_there_or_says_why_not(stack: Stack, app):
    org = stack.org()
    member = stack.user(org, role="member", password=PASSWORD)
    admin = stack.user(org, role="admin", password=PASSWORD)
    browser = app.test_client()
    sign_in(browser, member)
    text = browser.get(f"/orgs/{org}/jobs").get_data(as_text=True)
    assert '<button class="primary">Export projects</button>' in text
    assert "Import projects needs the admin role; yours here is member." in text
    assert 'name="file"' not in text

    stack.set_state(org, "read_only")
    browser = app.test_client()
    sign_in(browser, admin)
    text = browser.get(f"/orgs/{org}/jobs").get_data(as_text=True)
    assert "Import projects is unavailable: this organization is read-only" in text
    assert '<button class="primary">Export projects</button>' in text  # an owner may always take data out
    # And a POST anyway is refused with the same sentence.
    refused = browser.post(f"/orgs/{org}/jobs", content_type="multipart/form-data", data={
        "kind": "projects_import", "csrf": csrf_of(browser.get(f"/orgs/{org}/jobs")),
        "file": (io.BytesIO(b'{"projects": [{"name": "x"}]}'), "p.json")})
    assert refused.status_code == 409
    assert "Import projects is unavailable: this organization is read-only" in refused.get_data(as_text=True)


def test_the_jobs_list_filters_and_pages_like_the_api(stack: Stack, app):
    org = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    client = app.test_client()
    with stack.workers_paused():
        ids = [submit(client, org, owner, "bench.noop")["id"] for _ in range(53)]
        export = submit(client, org, owner, "projects_export")["id"]
    browser = app.test_client()
    sign_in(browser, owner)
    first = browser.get(f"/orgs/{org}/jobs").get_data(as_text=True)
    assert first.index(export[:8]) < first.index(ids[-1][:8])  # newest first
    assert ids[2][:8] not in first and "Older jobs" in first
    link = re.search(r'href="([^"]*cursor=[^"]+)">Older jobs', first).group(1).replace("&amp;", "&")
    second = browser.get(link).get_data(as_text=True)
    assert ids[0][:8] in second and export[:8] not in second and "Newest jobs" in second
    only = browser.get(f"/orgs/{org}/jobs?kind=projects_export").get_data(as_text=True)
    assert export[:8] in only and ids[-1][:8] not in only


def test_a_retry_is_shown_as_the_same_job_and_a_failure_says_what_to_do_next(stack: Stack, app, client):
    from tests.kinds import SECRET_MARKER

    org = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    browser = app.test_client()
    sign_in(browser, owner)
    job = submit(client, org, owner, "test.fail")
    url = f"/orgs/{org}/jobs/{job['id']}"
    wait_until(lambda: (row := stack.job_row(job["id"]))["attempts"] >= 1
               and row["status"] != "leased", interval=0.02, what="the first attempt failed")
    with stack.workers_paused():
        row = stack.job_row(job["id"])
        attempt = row["attempts"] + (1 if row["status"] == "queued" else 0)
        if row["status"] != "failed":
            page = browser.get(url).get_data(as_text=True)
            assert f"Retrying — attempt {attempt} of 3" in page
            assert "the same job, with the same id" in page and job["id"] in page
    row = stack.wait_for(job["id"], "failed", timeout=30)
    page = browser.get(url).get_data(as_text=True)
    assert "Failed" in page and "The job failed because of an internal error." in page
    assert "Try again with a new job. If it fails again, contact support" in page
    assert row["request_id"] and row["request_id"] in page
    assert SECRET_MARKER not in page and "RuntimeError" not in page


def test_the_switcher_lists_memberships_and_its_choice_is_checked_again_on_every_request(stack: Stack, app):
    first, second = stack.org("First Fleet"), stack.org("Second Star")
    person = stack.user(first, role="owner", password=PASSWORD)
    with stack.admin() as conn:
        from spacejobs.models.tenancy import accounts
        accounts.add_member(conn, second, person.id, "member")
    browser = app.test_client()
    sign_in(browser, person)
    page = browser.get(f"/orgs/{first}/jobs")
    text = page.get_data(as_text=True)
    assert '<label for="org-switch">Organization</label>' in text
    assert "First Fleet (owner)" in text and "Second Star (member)" in text
    switched = browser.post("/switch", data={"org": str(second), "csrf": csrf_of(page)})
    assert switched.headers["Location"] == f"/orgs/{second}/jobs"
    assert browser.get("/").headers["Location"] == f"/orgs/{second}/jobs"
    stack.remove_member(second, person.id)
    assert browser.get("/").headers["Location"] == f"/orgs/{first}/jobs"  # the stale choice is dropped
    refused = browser.post("/switch", data={"org": str(second), "csrf": csrf_of(page)})
    assert refused.status_code == 404


def test_the_job_page_works_without_javascript(stack: Stack, app, client):
    org = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    browser = app.test_client()
    sign_in(browser, owner)
    with stack.workers_paused():
        job = submit(client, org, owner, "projects_export")
        waiting = browser.get(f"/orgs/{org}/jobs/{job['id']}").get_data(as_text=True)
    assert '<noscript><meta http-equiv="refresh" content="3"></noscript>' in waiting
    assert ">Reload</a>" in waiting and "Queued — accepted, not started yet" in waiting
    stack.wait_for(job["id"], "completed")
    done = browser.get(f"/orgs/{org}/jobs/{job['id']}").get_data(as_text=True)
    assert 'http-equiv="refresh"' not in done and ">Reload</a>" not in done
    assert "Download the result" in done


# ----------------------------------------------------------------------------- jobs that wait

def test_a_timer_job_shows_until_when_it_waits_and_is_cancelled_from_its_page(stack: Stack, app,
                                                                             client):
    from datetime import UTC, datetime

    from spacejobs.webapp.status import moment

    org = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    browser = app.test_client()
    sign_in(browser, owner)
    job = submit(client, org, owner, "bench.wait", {"seconds": 3600})
    until = stack.wait_for(job["id"], "waiting")["wait_until"]
    url = f"/orgs/{org}/jobs/{job['id']}"
    page = browser.get(url)
    text = page.get_data(as_text=True)
    assert f"Waiting until {moment(until, datetime.now(UTC))}" in text
    assert "It holds no worker while it waits" in text
    assert 'data-status="waiting"' in text and ">Cancel job</button>" in text
    # The live part alone (what the page fetches on each event) says the same.
    fragment = browser.get(url + "/status", headers=HTML).get_data(as_text=True)
    assert f"Waiting until {moment(until, datetime.now(UTC))}" in fragment
    # The list and its filter name the state in words.
    listing = browser.get(f"/orgs/{org}/jobs?status=waiting").get_data(as_text=True)
    assert '<span class="pill s-waiting">Waiting</span>' in listing and job["id"][:8] in listing
    assert '<option value="waiting" selected>waiting</option>' in listing
    assert job["id"][:8] not in browser.get(f"/orgs/{org}/jobs?status=queued").get_data(as_text=True)

    cancelled = browser.post(url + "/cancel", data={"csrf": csrf_of(page)})
    assert cancelled.status_code == 302
    assert stack.job_row(job["id"])["status"] == "cancelled"  # at once: no worker to tell
    after = browser.get(url).get_data(as_text=True)
    assert "Cancelled while it waited: it will not run again." in after
    assert "The job was stopped and will not run again." in after and ">Cancel job</button>" not in after


def test_a_job_waiting_for_a_signal_names_it_until_the_signal_comes(stack: Stack, app, client):
    org = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    job = submit(client, org, owner, "bench.await_signal", {"name": "approved", "timeout": 3600})
    stack.wait_for(job["id"], "waiting")
    browser = app.test_client()
    sign_in(browser, owner)
    page = browser.get(f"/orgs/{org}/jobs/{job['id']}").get_data(as_text=True)
    assert "Waiting for the signal “approved”" in page and "at the latest" in page
    sent = client.post(f"/api/v1/orgs/{org}/jobs/{job['id']}/signals/approved", json={"ok": True},
                       headers=owner.auth)
    assert sent.status_code == 202
    stack.wait_for(job["id"], "completed")
    assert "Completed" in browser.get(f"/orgs/{org}/jobs/{job['id']}").get_data(as_text=True)


def test_a_fan_out_waiting_for_its_parts_says_how_many_are_done(stack: Stack, app, client):
    org = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    browser = app.test_client()
    sign_in(browser, owner)
    parts = [{"n": n, "seconds": 20} for n in range(3)]
    job = submit(client, org, owner, "test.fan", {"parts": parts, "max_parallel": 2})
    stack.wait_for(job["id"], "waiting")
    with stack.workers_paused():  # the parts cannot end (and resume it) while the page is read
        row = stack.job_row(job["id"])
        page = browser.get(f"/orgs/{org}/jobs/{job['id']}")
        text = page.get_data(as_text=True)
        # Its parts take 20 s each: none has ended since it began to wait.
        assert (row["status"], row["progress"]) == ("waiting", {"stage": "children", "done": 0,
                                                                "total": 3})
        assert "Waiting for its parts: 0 of 3 done" in text
        assert '<progress id="job-progress" max="3" value="0"' in text
    # (Not while frozen: a frozen worker may hold the lock of a part, which the cancel updates.)
    cancelled = browser.post(f"/orgs/{org}/jobs/{job['id']}/cancel", data={"csrf": csrf_of(page)})
    assert cancelled.status_code == 302
    assert stack.job_row(job["id"])["status"] == "cancelled"  # at once, its parts asked to stop
    assert "Cancelled while it waited" in browser.get(f"/orgs/{org}/jobs/{job['id']}").get_data(
        as_text=True)


def test_a_kinds_own_failure_of_a_job_from_python_asks_to_fix_the_input_and_quotes_its_job_id(
        stack: Stack, app, acme):
    org, people = acme
    with stack.app_db.begin() as conn:  # from Python: no web request, so no request id
        job = stack.jobs.submit(conn, "test.image_too_large", organization_id=org,
                                requested_by=people["owner"].id).job
    stack.wait_for(job.id, "failed")
    browser = app.test_client()
    sign_in(browser, people["owner"])
    page = browser.get(f"/orgs/{org}/jobs/{job.id}").get_data(as_text=True)
    assert "The image is larger than 10,000 pixels on a side." in page
    assert "a new job with the same input would fail the same way" in page
    assert "Try again" not in page
    assert "Request id" not in page and f"Job id <span class=\"mono\">{job.id}</span>" in page
