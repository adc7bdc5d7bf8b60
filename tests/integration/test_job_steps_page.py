"""A parent job's page lists its steps (a workflow's, by name) or parts (a fan-out's), each with
its status in the page's words and a link to its own page, live; to whoever may see the job and
to nobody else; names, kinds and statuses only. Read in ONE statement through the children's
index, as the web's role under row-level security. Real PostgreSQL, Redis and workers."""

from __future__ import annotations

import html as html_module
import re
import uuid

import pytest
from sqlalchemy import text

from spacejobs.models.db.transaction import transaction
from spacejobs.models.errors import NotFound
from spacejobs.models.jobs import store
from spacejobs.models.jobs.canvas import Signature, chain, sig
from spacejobs.models.kinds.registry import label_of
from tests.conftest import sign_in, submit
from tests.kit.stack import Stack, wait_until

PASSWORD = "correct horse battery staple"
HTML = {"Accept": "text/html"}
SECRET = "payload-secret-7c41"  # in a signal's payload, so in a step's result
ROW = re.compile(r'<tr data-step-status="([a-z_]+)">\s*<td>(?:<a href="([^"]+)">)?([^<]+)(?:</a>)?</td>'
                 r'\s*<td>.*?</td>\s*<td><span class="pill s-[a-z_]+">([^<]+)</span>', re.S)


def listed(html: str) -> list[tuple[str, str, str | None]]:
    """(name, status word, link) of each line of the page's list of steps."""
    return [(name, word, link or None) for _status, link, name, word in ROW.findall(html)]


def child_ids(stack: Stack, parent) -> dict[int, str]:
    with stack.admin() as conn:
        rows = conn.execute(text("SELECT child_index, id FROM jobs WHERE parent_id = :p"),
                            {"p": parent}).all()
    return {row.child_index: str(row.id) for row in rows}


def start_workflow(stack: Stack, org, user, canvas):
    with stack.app_db.begin() as conn:
        return stack.jobs.submit_workflow(conn, canvas, organization_id=org,
                                          requested_by=user.id).job


def test_a_workflows_page_lists_its_steps_and_its_status_part_follows_them(stack: Stack, app, client):
    org = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    member = stack.user(org, role="member", password=PASSWORD)  # may see any job of the org
    # The second step waits for a signal whose name is one of its params: the list must not
    # show it, nor the payload that becomes the step's result.
    job = start_workflow(stack, org, owner, chain(
        sig("test.add", n=41, name="warm up"),
        Signature("bench.await_signal", {"name": "go-ahead", "timeout": 3600}, "approval"),
        sig("test.add", n=1, name="wrap up")))
    wait_until(lambda: 1 in child_ids(stack, job.id)
               and stack.job_row(child_ids(stack, job.id)[1])["status"] == "waiting",
               30, what="the approval step waiting for its signal")
    ids = child_ids(stack, job.id)
    browser = app.test_client()
    sign_in(browser, member)
    url = f"/orgs/{org}/jobs/{job.id}"

    page = browser.get(url).get_data(as_text=True)
    before = browser.get(url + "/status", headers=HTML).get_data(as_text=True)
    for html in (page, before):
        assert listed(html) == [("warm up", "Completed", f"/orgs/{org}/jobs/{ids[0]}"),
                                ("approval", "Waiting", f"/orgs/{org}/jobs/{ids[1]}"),
                                ("wrap up", "Not started", None)]  # no job yet: nothing to link
        assert "Its steps (3)" in html and 'data-steps-live="yes"' in html
        assert "Waiting for its steps: 1 of 3 done" in html
        assert "go-ahead" not in html
    # A step's own page is a job page like any other, to the same member.
    assert browser.get(f"/orgs/{org}/jobs/{ids[1]}").status_code == 200

    sent = client.post(f"/api/v1/orgs/{org}/jobs/{ids[1]}/signals/go-ahead",
                       json={"secret": SECRET}, headers=owner.auth)
    assert sent.status_code == 202
    stack.wait_for(job.id, "completed", timeout=30)
    after = browser.get(url + "/status", headers=HTML).get_data(as_text=True)
    assert after != before
    ids = child_ids(stack, job.id)
    assert listed(after) == [("warm up", "Completed", f"/orgs/{org}/jobs/{ids[0]}"),
                             ("approval", "Completed", f"/orgs/{org}/jobs/{ids[1]}"),
                             ("wrap up", "Completed", f"/orgs/{org}/jobs/{ids[2]}")]
    assert 'data-steps-live="no"' in after
    whole = browser.get(url).get_data(as_text=True)
    assert 'http-equiv="refresh"' not in whole  # done, and every step of it
    for html in (after, whole):
        assert SECRET not in html and "go-ahead" not in html and "payload" not in html


def test_another_organizations_member_gets_the_usual_404_and_no_steps(stack: Stack, app):
    org = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    job = start_workflow(stack, org, owner, chain(sig("test.add", n=1, name="alpha-step"),
                                                  sig("test.add", n=2, name="omega-step")))
    stack.wait_for(job.id, "completed", timeout=30)
    elsewhere = stack.org()
    stranger = app.test_client()
    sign_in(stranger, stack.user(elsewhere, role="owner", password=PASSWORD))
    missing = stranger.get(f"/orgs/{org}/jobs/{uuid.uuid4()}", headers=HTML)
    for path in (f"/orgs/{org}/jobs/{job.id}", f"/orgs/{org}/jobs/{job.id}/status",
                 # their own organization's address, with this job's id
                 f"/orgs/{elsewhere}/jobs/{job.id}", f"/orgs/{elsewhere}/jobs/{job.id}/status"):
        answer = stranger.get(path, headers=HTML)
        assert (answer.status_code, answer.data) == (404, missing.data), path
        assert b"alpha-step" not in answer.data and b"omega-step" not in answer.data


def test_the_web_role_reads_only_its_own_organizations_steps(stack: Stack):
    org, elsewhere = stack.org(), stack.org()
    owner = stack.user(org, role="owner")
    stranger = stack.user(elsewhere, role="owner")
    job = start_workflow(stack, org, owner, chain(sig("test.add", n=1, name="one"),
                                                  sig("test.add", n=2, name="two")))
    stack.wait_for(job.id, "completed", timeout=30)
    with transaction(stack.app_db, organization_id=org, user_id=owner.id) as conn:
        mine = store.steps_of(conn, job.id, limit=200)
    assert [(s.name, s.status) for s in mine.rows] == [("one", "completed"), ("two", "completed")]
    assert mine.total == 2 and mine.more == 0
    # Row-level security: in another organization's transaction the parent and its children
    # are not there at all, whatever id is asked for.
    with transaction(stack.app_db, organization_id=elsewhere, user_id=stranger.id) as conn:
        assert store.steps_of(conn, job.id, limit=200) == store.Steps([], 0)
    # And the job API refuses a job of another organization before any statement.
    theirs = stack_job(stack, org, owner, job.id)
    with pytest.raises(NotFound), stack.jobs.transaction(elsewhere, stranger.id) as (conn, member):
        stack.jobs.steps(conn, member, theirs)


def stack_job(stack: Stack, org, user, job_id):
    with stack.jobs.transaction(org, user.id) as (conn, membership):
        return stack.jobs.get(conn, membership, job_id)


def test_a_fan_outs_parts_are_numbered_with_their_kind_and_the_list_is_bounded(
        stack: Stack, app, client, monkeypatch):
    import spacejobs.webapp.ui

    org = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    job = submit(client, org, owner, "test.fan", {"parts": [{"n": n} for n in range(4)],
                                                  "max_parallel": 4})
    stack.wait_for(job["id"], "completed", timeout=30)
    ids = child_ids(stack, job["id"])
    browser = app.test_client()
    sign_in(browser, owner)
    monkeypatch.setattr(spacejobs.webapp.ui, "STEPS_SHOWN", 3)
    html = browser.get(f"/orgs/{org}/jobs/{job['id']}").get_data(as_text=True)
    assert listed(html) == [(f"#{n + 1}", "Completed", f"/orgs/{org}/jobs/{ids[n]}") for n in range(3)]
    assert "Its parts (4)" in html and "and 1 more" in html and "test.part" in html
    assert '"square"' not in html and "square" not in html  # no part's result


def test_a_kinds_own_workflow_lists_its_steps_numbered_and_none_of_their_results(
        stack: Stack, app, client):
    """projects_report runs a chord of its own (ctx.workflow): its children are listed by
    place and kind; the projects' names its steps' results carry stay off the page."""
    org = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    for name in ("Vostok-7d2e", "Voskhod-19ab"):
        client.post(f"/api/v1/orgs/{org}/projects", json={"name": name}, headers=owner.auth)
    job = submit(client, org, owner, "projects_report", {"max_parallel": 1})
    stack.wait_for(job["id"], "completed", timeout=60)
    browser = app.test_client()
    sign_in(browser, owner)
    html = browser.get(f"/orgs/{org}/jobs/{job['id']}").get_data(as_text=True)
    assert [(name, word) for name, word, _link in listed(html)] == [
        ("#1", "Completed"), ("#2", "Completed"), ("#3", "Completed")]
    assert "Its steps (3)" in html and html.count("projects_report.project") == 2
    assert "Vostok-7d2e" not in html and "Voskhod-19ab" not in html


def test_the_list_is_one_statement_through_the_childrens_index(stack: Stack):
    """Planned with tens of thousands of rows, as the web role scoped to the organization (so with its
    row-level security): the parent by its key, every child through jobs_children_idx."""
    org = stack.org()
    owner = stack.user(org, role="owner")
    with stack.admin() as conn:
        for kind, params in (("workflow", "jsonb_build_object('steps', (SELECT jsonb_agg("
                              "jsonb_build_object('name', 's' || n, 'kind', 'bench.noop',"
                              " 'params', '{}'::jsonb, 'after', '[]'::jsonb))"
                              " FROM generate_series(1, 1000) n))"),
                             ("test.fan", "'{}'::jsonb")):
            parent = conn.execute(text(
                "INSERT INTO jobs (organization_id, requested_by, kind, params, status, lease_seconds,"
                f" max_attempts, attempts, finished_at) VALUES (:org, :user, :kind, {params},"
                " 'completed', 30, 3, 1, now()) RETURNING id"),
                {"org": org, "user": owner.id, "kind": kind}).scalar_one()
            conn.execute(text(
                "INSERT INTO jobs (organization_id, requested_by, kind, status, lease_seconds,"
                " max_attempts, attempts, finished_at, parent_id, child_index)"
                " SELECT :org, :user, 'bench.noop', 'completed', 30, 3, 1, now(), :parent, n - 1"
                " FROM generate_series(1, 1000) n"), {"org": org, "user": owner.id, "parent": parent})
        # Its children are a sliver of the organization's jobs, as in any real table.
        conn.execute(text(
            "INSERT INTO jobs (organization_id, requested_by, kind, status, lease_seconds,"
            " max_attempts, attempts, finished_at)"
            " SELECT :org, :user, 'bench.noop', 'completed', 30, 3, 1, now()"
            " FROM generate_series(1, 20000)"), {"org": org, "user": owner.id})
        conn.execute(text("ANALYZE jobs"))
    statement = store.Q["steps_of"].text
    parents = child_parents(stack, org)
    for parent in parents:
        with transaction(stack.app_db, organization_id=org, user_id=owner.id) as conn:
            plan = "\n".join(row[0] for row in conn.execute(
                text("EXPLAIN " + statement), {"parent": parent, "limit": 200, "after": -1}))
            steps = store.steps_of(conn, parent, limit=200)
        assert "jobs_children_idx" in plan and "jobs_pkey" in plan, plan
        assert "Seq Scan on jobs" not in plan, plan
        assert (len(steps.rows), steps.total, steps.more) == (200, 1000, 800)
        assert [s.place for s in steps.rows] == list(range(200))


def child_parents(stack: Stack, org) -> list[uuid.UUID]:
    with stack.admin() as conn:
        return list(conn.execute(text(
            "SELECT DISTINCT parent_id FROM jobs WHERE organization_id = :org"
            " AND parent_id IS NOT NULL"), {"org": org}).scalars())


def facts_of(html: str) -> dict[str, str]:
    """The job page's facts (Kind, Started by, Attempt...), as text."""
    found = re.findall(r"<dt>([^<]+)</dt><dd>(.*?)</dd>", html, re.S)
    return {term: html_module.unescape(re.sub(r"<[^>]+>", "", value)).strip()
            for term, value in found}


def test_a_steps_page_links_back_to_its_workflow_and_a_part_to_its_parent(stack: Stack, app,
                                                                         client):
    org = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    job = start_workflow(stack, org, owner, chain(sig("test.add", n=1, name="warm up"),
                                                  sig("test.add", n=2, name="wrap up")))
    fan = submit(client, org, owner, "test.fan", {"parts": [{"n": 1}, {"n": 2}]})
    stack.wait_for(job.id, "completed", timeout=30)
    stack.wait_for(fan["id"], "completed", timeout=30)
    browser = app.test_client()
    sign_in(browser, owner)
    step = browser.get(f"/orgs/{org}/jobs/{child_ids(stack, job.id)[1]}").get_data(as_text=True)
    back = f'<a href="/orgs/{org}/jobs/{job.id}">Workflow <span class="mono">{str(job.id)[:8]}</span></a>'
    assert "Step “wrap up” of" in step and back in step
    part = browser.get(f"/orgs/{org}/jobs/{child_ids(stack, fan['id'])[0]}").get_data(as_text=True)
    assert "Part #1 of" in part
    assert f'<a href="/orgs/{org}/jobs/{fan["id"]}">{label_of("test.fan")}' in part
    parent = browser.get(f"/orgs/{org}/jobs/{job.id}").get_data(as_text=True)
    assert 'class="parent"' not in parent  # nothing started the workflow but its requester


def test_a_waiting_job_and_a_waiting_workflow_show_the_attempt_they_are_in(stack: Stack, app,
                                                                          client):
    """A wait uses no attempt up, and the job waits in the attempt it ran in: its row, its JSON
    and its page say 1 while it waits (they said 0), and so does a job cancelled while it
    waited."""
    org = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    job = start_workflow(stack, org, owner, chain(
        Signature("bench.await_signal", {"name": "go-ahead", "timeout": 3600}, "approval")))
    wait_until(lambda: 0 in child_ids(stack, job.id)
               and stack.job_row(child_ids(stack, job.id)[0])["status"] == "waiting",
               30, what="the approval step waiting for its signal")
    step = child_ids(stack, job.id)[0]
    browser = app.test_client()
    sign_in(browser, owner)
    shown = facts_of(browser.get(f"/orgs/{org}/jobs/{step}").get_data(as_text=True))
    assert shown["Attempt"] == "1 of 3, waiting (a wait uses no attempt up)"
    assert client.get(f"/api/v1/orgs/{org}/jobs/{step}", headers=owner.auth).get_json()[
        "attempts"] == 1
    shown = facts_of(browser.get(f"/orgs/{org}/jobs/{job.id}").get_data(as_text=True))
    assert shown["Attempt"] == ("1 of 10, waiting (a wait uses no attempt up); the workflow's own, "
                                "to start and collect its steps: each step has its own")
    client.post(f"/api/v1/orgs/{org}/jobs/{job.id}/cancel", headers=owner.auth)
    stack.wait_for(job.id, "cancelled", timeout=30)
    assert stack.job_row(step)["status"] == "cancelled" and stack.job_row(step)["attempts"] == 1
    assert stack.job_row(job.id)["attempts"] == 1
    shown = facts_of(browser.get(f"/orgs/{org}/jobs/{step}").get_data(as_text=True))
    assert shown["Attempt"] == "1 of 3"
    queued = submit(client, org, owner, "bench.sleep", {"seconds": 0})
    assert facts_of(browser.get(f"/orgs/{org}/jobs/{queued['id']}").get_data(as_text=True))[
        "Attempt"] in ("none yet (at most 5)", "1 of 5")
