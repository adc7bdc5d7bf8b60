"""Issue 9, "Sessions and operators", each item as the attack that worked before its fix:
revocable sessions, CSRF keyed on how a request authenticated, /ops answering the same 404 to
every method, and the kind's role on cancel and result reads. Plus the CSRF token on every
form, the sign-in throttle and the events stream's ids."""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import timedelta

import pytest
from flask import url_for
from sqlalchemy import text

from spacejobs.models.db.transaction import transaction
from spacejobs.models.errors import InsufficientRole, NotFound
from spacejobs.models.jobs import store
from spacejobs.models.jobs.service import Jobs
from spacejobs.models.kinds import kind_roles
from spacejobs.models.tenancy import accounts, passwords
from tests.conftest import csrf_of, sign_in, submit
from tests.integration.test_job_lifecycle import read_events
from tests.kit.seeding import TestUser
from tests.kit.stack import Stack

PASSWORD = "correct horse battery staple"
HTML = {"Accept": "text/html"}
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


@pytest.fixture(scope="module")
def operator(stack: Stack) -> TestUser:
    found = stack.operator()
    with stack.admin() as conn:
        passwords.set_password(conn, found.id, PASSWORD)
    found.password = PASSWORD
    return found


def kind_paused(stack: Stack, kind: str) -> bool:
    with transaction(stack.operator_db) as conn:
        return bool(conn.execute(text("SELECT paused FROM kind_settings WHERE kind = :k"),
                                 {"k": kind}).scalar_one_or_none())


# ----------------------------------------------------------------------------- /ops: 404 for every method

def test_every_ops_url_answers_every_method_with_the_404_of_an_unknown_url(stack: Stack, app, client):
    """Attack: PUT or OPTIONS /ops answered 405 with an Allow header, telling anyone it exists."""
    org = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    job = submit(client, org, owner, "bench.noop")
    signed_in = app.test_client()
    sign_in(signed_in, owner)
    urls = ["/ops", "/ops/", "/ops/jobs", "/ops/workers", f"/ops/jobs/{job['id']}", "/ops/api/overview",
            "/ops/api/jobs", f"/ops/api/jobs/{job['id']}/cancel", "/ops/api/kinds/bench.noop/pause",
            "/ops/api/kinds/bench.noop/limit", "/ops/no-such-page", "/metrics"]
    callers = [(client, {}), (client, owner.auth), (client, {"Authorization": "Bearer sj_forged"}),
               (signed_in, {}), (signed_in, {"Authorization": ""})]
    for who, headers in callers:
        for accept in ({}, HTML):
            for method in METHODS:
                expected = who.open("/nope", method=method, headers={**headers, **accept})
                for url in urls:
                    answer = who.open(url, method=method, headers={**headers, **accept})
                    assert (answer.status_code, answer.data) == (404, expected.data), (method, url, headers)
                    assert "Allow" not in answer.headers, (method, url)
    assert stack.job_row(job["id"])["status"] == "completed"


def _operator_urls(app, job_id: str) -> list[str]:
    """Every route of the operators' blueprint in the app's url_map, its variables filled in
    (with real values where the name says what they hold, so an operator's request would act)."""
    known = {"job_id": job_id, "kind": "bench.noop", "action": "pause"}
    urls = []
    with app.test_request_context():
        for rule in app.url_map.iter_rules():
            if rule.endpoint.startswith("ops."):
                urls.append(url_for(rule.endpoint, **{name: known.get(name, uuid.uuid4().hex)
                                                      for name in rule.arguments}))
    return urls


def _seen(answer) -> tuple[int, bytes, list[tuple[str, str]]]:
    """What a stranger sees of an answer: status, body and every header but Date."""
    return answer.status_code, answer.data, sorted((k, v) for k, v in answer.headers if k != "Date")


def test_an_operator_url_answers_exactly_the_404_of_an_unknown_url_headers_included(stack: Stack, app,
                                                                                   client):
    """Attack: anonymous GET /ops, /ops/api/jobs, /metrics... answered the body of /nope but
    added ``Vary: Cookie``, which an unknown URL does not: the operators' routes could be listed."""
    org = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    job = submit(client, org, owner, "bench.noop")
    signed_in = app.test_client()
    sign_in(signed_in, owner)
    visited_login = app.test_client()
    visited_login.get("/login")  # a cookie that holds no session yet
    urls = _operator_urls(app, job["id"])
    assert {"/ops", "/ops/api/jobs", "/metrics"} <= set(urls) and len(urls) >= 8
    callers = {"anonymous": (client, {}), "a browser that opened /login": (visited_login, {}),
               "a signed-in non-operator": (signed_in, {}),
               "a non-operator's token": (client, owner.auth)}
    for who, (browser, credential) in callers.items():
        for accept in ({}, HTML):
            for method in ("GET", "POST"):
                headers = {**credential, **accept, "X-Request-ID": "same-for-both"}
                for url in urls:
                    unknown = browser.open(f"/nope-{uuid.uuid4().hex}", method=method, headers=headers)
                    answer = browser.open(url, method=method, headers=headers)
                    assert unknown.status_code == 404
                    assert _seen(answer) == _seen(unknown), (who, method, url, accept)
                    # nor a cookie stamped with the time, which would tell two answers apart too
                    assert "Set-Cookie" not in answer.headers, (who, method, url)
    # and nothing was done: the job ran once, as submitted, and no retry was made of it
    assert stack.wait_for(job["id"], "completed", "cancelled")["status"] == "completed"
    assert sum(stack.job_counts(org).values()) == 1


# ----------------------------------------------------------------------------- CSRF by how it authenticated

@pytest.mark.parametrize("authorization", ["", "Bearer ", "Bearer   ", "Basic b2xnYTpodW50ZXIy", "sj_x"])
def test_an_operators_cookie_with_a_non_token_authorization_header_still_needs_the_csrf_token(
        stack: Stack, app, client, operator, authorization):
    """Attack: cookie + an empty ``Authorization:`` header paused a kind and cancelled a job
    without a CSRF token, because the exemption looked at the header, not at the credential."""
    org = stack.org()
    owner = stack.user(org, role="owner")
    browser = app.test_client()
    sign_in(browser, operator)
    with stack.workers_paused():
        job = submit(client, org, owner, "bench.noop")
        headers = {"Authorization": authorization}
        assert browser.post("/ops/api/kinds/bench.noop/pause", headers=headers).status_code == 400
        assert browser.post(f"/ops/api/jobs/{job['id']}/cancel", headers=headers).status_code == 400
        assert browser.post("/ops/api/kinds/bench.noop/limit", headers=headers,
                            data={"limit": "0"}).status_code == 400
        assert not kind_paused(stack, "bench.noop")
        assert stack.job_row(job["id"])["status"] == "queued"
    # A real bearer token needs no CSRF token: a cross-site page cannot send one.
    assert client.post("/ops/api/kinds/bench.noop/pause", headers=operator.auth).status_code == 200
    assert client.post("/ops/api/kinds/bench.noop/resume", headers=operator.auth).status_code == 200


def _forms(stack: Stack, app, client, operator):
    """Every form of the site, each with what proves it did nothing."""
    org = stack.org()
    other = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    stack.user(other, role="member").id  # noqa: B018 - a second organization to switch to
    with stack.admin() as conn:
        accounts.add_member(conn, other, owner.id, "member")
    queued = submit(client, org, owner, "bench.noop")  # the caller keeps the workers paused
    jobs_before = lambda: len(client.get(f"/api/v1/orgs/{org}/jobs", headers=owner.auth).get_json()["jobs"])  # noqa: E731
    projects = lambda: client.get(f"/api/v1/orgs/{org}/projects", headers=owner.auth).get_json()["projects"]  # noqa: E731
    n_jobs = jobs_before()
    return owner, [
        ("/logout", {}, lambda b: b.get(f"/orgs/{org}/jobs").status_code == 200),
        ("/switch", {"org": str(other)}, lambda b: b.get("/").headers["Location"] == f"/orgs/{org}/jobs"),
        (f"/orgs/{org}/projects", {"name": "csrf-test"}, lambda b: projects() == []),
        (f"/orgs/{org}/jobs", {"kind": "projects_export"}, lambda b: jobs_before() == n_jobs),
        (f"/orgs/{org}/jobs/{queued['id']}/cancel", {},
         lambda b: stack.job_row(queued["id"])["status"] == "queued"),
        ("/ops/api/kinds/bench.noop/pause", {}, lambda b: not kind_paused(stack, "bench.noop")),
        (f"/ops/api/jobs/{queued['id']}/cancel", {},
         lambda b: stack.job_row(queued["id"])["status"] == "queued"),
    ], org


def test_every_form_refuses_a_post_without_its_csrf_token(stack: Stack, app, client, operator):
    with stack.workers_paused():
        owner, forms, org = _forms(stack, app, client, operator)
        for url, data, unchanged in forms:
            browser = app.test_client()
            sign_in(browser, operator if url.startswith("/ops") else owner)
            real = csrf_of(browser.get("/ops" if url.startswith("/ops") else f"/orgs/{org}/jobs"))
            for sent in ({}, {"csrf": ""}, {"csrf": "0" * len(real)}, {"csrf": real[:-1]}):
                answer = browser.post(url, data={**data, **sent})
                assert answer.status_code == 400, (url, sent, answer.status_code)
                assert unchanged(browser), url
    # The sign-in form too: a login CSRF would sign a victim into the attacker's account.
    anonymous = app.test_client()
    answer = anonymous.post("/login", data={"email": owner.email, "password": PASSWORD})
    assert answer.status_code == 400 and anonymous.get("/").headers["Location"] == "/login"


def test_every_post_form_on_every_page_carries_the_csrf_token(stack: Stack, app, client, operator):
    org = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    job = submit(client, org, owner, "bench.sleep", {"seconds": 5})
    stack.wait_for(job["id"], "leased")
    person, ops = app.test_client(), app.test_client()
    sign_in(person, owner)
    sign_in(ops, operator)
    pages = [(person, f"/orgs/{org}/jobs"), (person, f"/orgs/{org}/projects"),
             (person, f"/orgs/{org}/jobs/{job['id']}"), (ops, "/ops"), (ops, f"/ops/jobs/{job['id']}"),
             (app.test_client(), "/login")]
    seen = 0
    for who, url in pages:
        html = who.get(url).get_data(as_text=True)
        for form in re.findall(r'<form[^>]*method="post".*?</form>', html, flags=re.S):
            assert 'name="csrf"' in form, (url, form[:200])
            seen += 1
    assert seen >= 8
    client.post(f"/api/v1/orgs/{org}/jobs/{job['id']}/cancel", headers=owner.auth)


# ----------------------------------------------------------------------------- the kind's role

def test_a_plain_member_cannot_cancel_an_admins_import(stack: Stack, app, client):
    """Attack: a plain member cancelled an admin's import, through the pages before, and through
    the Python API (Jobs.cancel) until it took the web's rule: one rule, every entry point."""
    org = stack.org()
    admin = stack.user(org, role="admin", password=PASSWORD)
    member = stack.user(org, role="member", password=PASSWORD)
    other_member = stack.user(org, role="member")
    browser = app.test_client()
    sign_in(browser, member)
    with stack.workers_paused():
        imported = submit(client, org, admin, "projects_import", {"projects": [{"name": "x"}]})
        refused = client.post(f"/api/v1/orgs/{org}/jobs/{imported['id']}/cancel", headers=member.auth)
        assert refused.status_code == 403
        assert refused.get_json()["error"]["code"] == "insufficient_role"
        page = browser.get(f"/orgs/{org}/jobs/{imported['id']}")
        assert "Cancel job" not in page.get_data(as_text=True)
        assert "Only the person who started this job, or a member with the admin role" in page.get_data(
            as_text=True)
        forced = browser.post(f"/orgs/{org}/jobs/{imported['id']}/cancel", data={"csrf": csrf_of(page)})
        assert forced.status_code == 403
        with stack.app_db.begin() as conn, pytest.raises(InsufficientRole):
            jobs = Jobs(conn.engine)
            jobs.cancel(conn, jobs.member(conn, org, member.id), imported["id"])
        stranger = stack.user(stack.org(), role="owner")  # an owner, of another organization
        with stack.app_db.begin() as conn, pytest.raises(NotFound):
            jobs = Jobs(conn.engine)
            jobs.cancel(conn, jobs.member(conn, org, stranger.id), imported["id"])
        assert stack.job_row(imported["id"])["status"] == "queued"

        # The requester may stop their own job; a member holding the kind's role may stop anyone's.
        own = submit(client, org, member, "projects_export")
        assert client.post(f"/api/v1/orgs/{org}/jobs/{own['id']}/cancel",
                           headers=member.auth).status_code == 200
        theirs = submit(client, org, other_member, "projects_export")
        assert client.post(f"/api/v1/orgs/{org}/jobs/{theirs['id']}/cancel",
                           headers=member.auth).status_code == 200
        assert client.post(f"/api/v1/orgs/{org}/jobs/{imported['id']}/cancel",
                           headers=admin.auth).status_code == 200
    assert stack.job_row(imported["id"])["status"] == "cancelled"


def test_the_cancel_statement_itself_holds_the_rule_for_every_caller(stack: Stack, client):
    """Attack: code that reached the cancel statement without the web's check (the Python API
    did) let anyone in the organization stop anything. The rule now lives in the statement."""
    org = stack.org()
    admin = stack.user(org, role="admin")
    member = stack.user(org, role="member")
    other_admin = stack.user(org, role="admin")
    leaving = stack.user(org, role="admin")
    outsider = stack.user(stack.org(), role="owner")

    def cancel(user, job, **rule):
        with transaction(stack.app_db, organization_id=org, user_id=user.id) as conn:
            return store.request_cancel(conn, job["id"], user.id, **rule)

    with stack.workers_paused():
        imported = submit(client, org, admin, "projects_import", {"projects": [{"name": "x"}]})
        own = submit(client, org, leaving, "projects_export")
        with pytest.raises(InsufficientRole):
            cancel(member, imported, kind_roles=kind_roles())
        with pytest.raises(InsufficientRole):  # without the registry's roles, only an owner
            cancel(other_admin, imported)
        with pytest.raises(InsufficientRole):  # says it is an operator; is not one
            cancel(member, imported, as_operator=True)
        with pytest.raises(InsufficientRole):  # an owner, of another organization
            cancel(outsider, imported, kind_roles=kind_roles())
        with stack.admin() as conn:  # the requester, removed since
            accounts.remove_member(conn, org, leaving.id)
        with pytest.raises(InsufficientRole):
            cancel(leaving, own, kind_roles=kind_roles())
        assert {stack.job_row(j["id"])["status"] for j in (imported, own)} == {"queued"}
        assert cancel(admin, imported, kind_roles=kind_roles()).status == "cancelled"


def test_the_cancel_statement_refuses_everyone_of_a_deleted_organization(stack: Stack, client):
    """The web refuses a deleted organization's members before any statement runs; the cancel
    statement must too, for code that reaches it directly (its owner, its own job)."""
    org = stack.org()
    owner = stack.user(org, role="owner")
    with stack.workers_paused():
        job = submit(client, org, owner, "projects_export")
        with stack.admin() as conn:
            accounts.set_organization_state(conn, org, "deleted")
        with pytest.raises(InsufficientRole), \
                transaction(stack.app_db, organization_id=org, user_id=owner.id) as conn:
            store.request_cancel(conn, job["id"], owner.id, kind_roles=kind_roles())
        assert stack.job_row(job["id"])["status"] == "queued"


def test_reading_a_result_needs_the_kinds_role(stack: Stack, app, client):
    org = stack.org()
    admin = stack.user(org, role="admin")
    member = stack.user(org, role="member", password=PASSWORD)
    imported = submit(client, org, admin, "projects_import", {"projects": [{"name": "x"}]})
    stack.wait_for(imported["id"], "completed")
    refused = client.get(imported["links"]["result"], headers=member.auth)
    assert refused.status_code == 403 and refused.get_json()["error"]["code"] == "insufficient_role"
    assert client.get(imported["links"]["result"], headers=admin.auth).status_code == 200
    browser = app.test_client()
    sign_in(browser, member)
    page = browser.get(f"/orgs/{org}/jobs/{imported['id']}").get_data(as_text=True)
    assert "Downloading the result needs the admin role." in page and "Download the result" not in page
    assert browser.get(f"/orgs/{org}/jobs/{imported['id']}/download").status_code == 403


# ----------------------------------------------------------------------------- revocable sessions

def test_after_sign_out_a_copied_cookie_opens_nothing(stack: Stack, app, operator):
    """Attack: after /logout the old cookie still opened /ops."""
    browser = app.test_client()
    sign_in(browser, operator)
    cookie = browser.get_cookie("spacejobs_session")
    thief = app.test_client()
    thief.set_cookie("spacejobs_session", cookie.value)
    assert thief.get("/ops").status_code == 200
    assert browser.post("/logout", data={"csrf": csrf_of(browser.get("/ops"))}).status_code == 302
    assert thief.get("/ops").status_code == 404
    assert thief.post("/ops/api/kinds/bench.noop/pause").status_code == 404
    assert thief.get("/").headers["Location"] == "/login"


def test_a_new_password_or_a_sign_out_from_the_cli_ends_every_session(stack: Stack, app):
    org = stack.org()
    user = stack.user(org, role="owner", password=PASSWORD)
    first, second = app.test_client(), app.test_client()
    sign_in(first, user)
    sign_in(second, user)
    done = stack.cli("users", "set-password", user.email, "--password-stdin", stdin="a brand new password\n")
    assert done.returncode == 0, done.stderr
    assert "2 web session(s) signed out" in done.stderr and "brand new" not in done.stdout + done.stderr
    for browser in (first, second):
        assert browser.get(f"/orgs/{org}/jobs").headers["Location"].startswith("/login")
    user.password = "a brand new password"
    sign_in(first, user)
    assert stack.cli("users", "sign-out", user.email).returncode == 0
    assert first.get(f"/orgs/{org}/jobs").headers["Location"].startswith("/login")
    short = stack.cli("users", "set-password", user.email, "--password-stdin", stdin="short\n")
    assert short.returncode != 0 and "10 to 1024 characters" in short.stderr


def test_a_removed_member_gets_the_strangers_404_on_the_next_click(stack: Stack, app):
    org = stack.org()
    owner = stack.user(org, role="owner")
    member = stack.user(org, role="member", password=PASSWORD)
    stranger = stack.user(stack.org(), role="owner", password=PASSWORD)
    job = submit(app.test_client(), org, owner, "bench.noop")
    browser, outsider = app.test_client(), app.test_client()
    sign_in(browser, member)
    sign_in(outsider, stranger)
    assert browser.get(f"/orgs/{org}/projects").status_code == 200
    stack.remove_member(org, member.id)
    for url in (f"/orgs/{org}/projects", f"/orgs/{org}/jobs", f"/orgs/{org}/jobs/{job['id']}",
                f"/orgs/{org}/jobs/{job['id']}/status", f"/orgs/{org}/jobs/{job['id']}/download"):
        mine, theirs = browser.get(url, headers=HTML), outsider.get(url, headers=HTML)
        assert (mine.status_code, mine.data) == (404, theirs.data), url
    # Their session itself is fine: `/` no longer offers that organization.
    assert "You are not a member of any organization yet" in browser.get("/").get_data(as_text=True)


def test_a_deleted_user_is_out_at_once(stack: Stack, app):
    org = stack.org()
    user = stack.user(org, role="member", password=PASSWORD)
    browser = app.test_client()
    sign_in(browser, user)
    with stack.admin() as conn:
        conn.execute(text("DELETE FROM users WHERE id = :id"), {"id": user.id})
    assert browser.get(f"/orgs/{org}/jobs").headers["Location"].startswith("/login")


def test_sessions_end_when_idle_and_at_their_absolute_end_and_cookies_are_guarded(stack: Stack):
    org = stack.org()
    user = stack.user(org, role="member", password=PASSWORD)
    idle = stack.make_app(SESSION_IDLE_SECONDS=0.5).test_client()
    sign_in(idle, user)
    assert idle.get(f"/orgs/{org}/jobs").status_code == 200
    time.sleep(0.7)
    assert idle.get(f"/orgs/{org}/jobs").status_code == 302

    short = stack.make_app(PERMANENT_SESSION_LIFETIME=timedelta(seconds=1.2),
                           SESSION_COOKIE_SECURE=True).test_client()
    answer = short.post("/login", data={"email": user.email, "password": PASSWORD,
                                        "csrf": csrf_of(short.get("/login"))})
    cookie = answer.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Secure" in cookie
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:  # busy all along: the absolute end still comes
        short.get(f"/orgs/{org}/jobs", base_url="https://localhost")
        time.sleep(0.2)
    assert short.get(f"/orgs/{org}/jobs", base_url="https://localhost").status_code == 302


def test_tokens_revoke_refuses_the_very_next_request(stack: Stack, client):
    org = stack.org()
    user = stack.user(org, role="member")
    assert client.get("/api/v1/me", headers=user.auth).status_code == 200
    done = stack.cli("tokens", "revoke", "-", stdin=user.token + "\n")
    assert done.returncode == 0, done.stderr
    assert client.get("/api/v1/me", headers=user.auth).status_code == 401

    with stack.admin() as conn:
        second = accounts.create_token(conn, user.id)
    listed = stack.cli("tokens", "list", user.email).stdout.splitlines()
    live = [line.split()[0] for line in listed if line.endswith("live")]
    assert len(listed) == 2 and len(live) == 1
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {second}"}).status_code == 200
    assert stack.cli("tokens", "revoke", live[0]).returncode == 0
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {second}"}).status_code == 401
    again = stack.cli("tokens", "revoke", live[0])
    assert again.returncode != 0 and "No live token" in again.stderr


# ----------------------------------------------------------------------------- sign-in throttle

def test_failed_sign_ins_are_throttled_per_account_and_per_address(stack: Stack):
    org = stack.org()
    anna = stack.user(org, role="member", password=PASSWORD)
    bob = stack.user(org, role="member", password=PASSWORD)
    app = stack.make_app(LOGIN_RATE_LIMIT_ACCOUNT="3 per minute", LOGIN_RATE_LIMIT_ADDRESS="5 per minute")
    browser = app.test_client()

    def attempt(user: TestUser, password: str, addr: str = "10.0.0.1"):
        page = browser.get("/login", environ_base={"REMOTE_ADDR": addr})
        return browser.post("/login", data={"email": user.email, "password": password,
                                            "csrf": csrf_of(page)}, environ_base={"REMOTE_ADDR": addr})

    assert [attempt(anna, "wrong").status_code for _ in range(3)] == [401, 401, 401]
    throttled = attempt(anna, PASSWORD)  # even the right password: the account waits, here
    assert throttled.status_code == 429 and int(throttled.headers["Retry-After"]) > 0
    assert "Too many sign-in attempts" in throttled.get_data(as_text=True)
    # The address: 3 failed sign-ins so far (a throttled try checks no password and is not
    # counted); two more for another account reach its limit of 5.
    assert [attempt(bob, "wrong").status_code for _ in range(2)] == [401, 401]
    assert attempt(bob, PASSWORD).status_code == 429
    assert attempt(bob, PASSWORD, addr="10.0.0.3").status_code == 302  # elsewhere bob is fine

    # Successful sign-ins are not counted.
    calm = stack.make_app(LOGIN_RATE_LIMIT_ACCOUNT="2 per minute").test_client()
    for _ in range(4):
        sign_in(calm, bob)
        calm.post("/logout", data={"csrf": csrf_of(calm.get(f"/orgs/{org}/jobs"))})


def test_one_address_failing_sign_ins_for_someone_cannot_lock_them_out_elsewhere(stack: Stack):
    """Attack: three wrong passwords a minute for someone else's email, from one address, kept
    that person out from every address (the per-account limit was keyed on the email alone,
    which the attacker chooses) and every throttled try counted again, so it never ended."""
    anna = stack.user(stack.org(), role="member", password=PASSWORD)
    app = stack.make_app(LOGIN_RATE_LIMIT_ACCOUNT="3 per minute",
                         LOGIN_RATE_LIMIT_ACCOUNT_GLOBAL="5 per minute")

    def attempt(password: str, addr: str):
        browser = app.test_client()
        page = browser.get("/login", environ_base={"REMOTE_ADDR": addr})
        return browser.post("/login", data={"email": anna.email, "password": password,
                                            "csrf": csrf_of(page)}, environ_base={"REMOTE_ADDR": addr})

    assert [attempt("wrong", "203.0.113.7").status_code for _ in range(10)] == [401] * 3 + [429] * 7
    assert attempt(PASSWORD, "198.51.100.9").status_code == 302  # she signs in from her own address
    # The backstop: guesses spread over addresses, each under its own limit, stop at the
    # account's across all of them (3 + 2 = 5); then she waits too, wherever she is.
    assert [attempt("wrong", "192.0.2.1").status_code for _ in range(2)] == [401, 401]
    assert attempt("wrong", "192.0.2.2").status_code == 429
    assert attempt(PASSWORD, "198.51.100.9").status_code == 429


# ----------------------------------------------------------------------------- the events stream

def _first_event(response) -> tuple[str, str, dict]:
    buffer = ""
    for chunk in response.response:
        buffer += chunk.decode() if isinstance(chunk, bytes) else chunk
        for block in buffer.split("\n\n")[:-1]:
            fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
            if "event" in fields:
                response.close()
                return fields["id"], fields["event"], json.loads(fields["data"])
    raise AssertionError("the stream ended without an event")


def test_events_carry_ids_and_a_reconnect_resumes_after_last_event_id(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    job = submit(client, org, anna, "bench.sleep", {"seconds": 2})
    stack.wait_for(job["id"], "leased")
    url = job["links"]["events"]
    first_id, name, data = _first_event(client.get(url, headers=anna.auth, buffered=False))
    assert data["status"] == "leased" and name == "status"
    assert first_id.startswith("1.leased.")

    # Reconnecting with the id of what we have: nothing again, only what comes after.
    resumed = client.get(url, headers={**anna.auth, "Last-Event-ID": first_id})
    body = resumed.get_data(as_text=True)
    assert body.startswith("retry: ")
    events = read_events(resumed)
    assert [e["status"] for _, e in events] == ["completed"]
    last_id = re.findall(r"^id: (.+)$", body, flags=re.M)[-1]
    assert last_id != first_id and last_id.startswith("1.completed.")

    # A finished job the client has already seen: 204 tells an EventSource to stop reconnecting.
    assert client.get(url, headers={**anna.auth, "Last-Event-ID": last_id}).status_code == 204
    # An unknown or stale id gets the current state at once.
    assert [e["status"] for _, e in read_events(
        client.get(url, headers={**anna.auth, "Last-Event-ID": "garbage"}))] == ["completed"]


def test_a_session_watching_a_job_stops_receiving_once_signed_out(stack: Stack, app, client):
    org = stack.org()
    anna = stack.user(org, role="owner", password=PASSWORD)
    job = submit(client, org, anna, "bench.sleep", {"seconds": 4})
    stack.wait_for(job["id"], "leased")
    browser = app.test_client()
    sign_in(browser, anna)
    stream = browser.get(job["links"]["events"], buffered=False)
    chunks = iter(stream.response)
    seen = ""
    while "event: status" not in seen:
        seen += next(chunks).decode()
    other = app.test_client()
    other.set_cookie("spacejobs_session", browser.get_cookie("spacejobs_session").value)
    other.post("/logout", data={"csrf": csrf_of(other.get(f"/orgs/{org}/jobs"))})
    rest = "".join(c.decode() for c in chunks)
    assert "event: error" in rest and '"not_found"' in rest
    assert "completed" not in rest
