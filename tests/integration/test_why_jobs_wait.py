"""Why a job that has not started waits, as the JSON (``waiting_reason``) and the job page say
it: behind a rate limit (until when), behind the job before it in its sequence, delayed (until
when); read as the web role, under its organization's scope."""

from __future__ import annotations

import html
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.kinds import RateLimit
from spacejobs.models.tenancy import accounts
from tests.conftest import sign_in, submit
from tests.integration.test_job_lifecycle import parse_events
from tests.kit.stack import Stack

PASSWORD = "a long and careful password"


def empty(stack: Stack) -> None:
    """No queued job of an earlier test (a claim below takes any organization's)."""
    with stack.admin() as conn:
        conn.execute(text("DELETE FROM jobs"))


def claim(stack: Stack, limit: int) -> list[str]:
    with transaction(stack.worker_db, actor="worker:why") as conn:
        return [str(job.id) for job in store.claim_batch(conn, "why", limit=limit,
                                                         after_organization=store.NO_ORGANIZATION)]


def window_starts(stack: Stack, org: uuid.UUID, kind: str) -> list[datetime]:
    with stack.admin() as conn:
        return conn.execute(text("SELECT starts FROM rate_limit_windows"
                                 " WHERE organization_id = :org AND kind = :kind"),
                            {"org": org, "kind": kind}).scalar_one()


@pytest.fixture()
def quiet_stack(bare_stack: Stack) -> Iterator[Stack]:
    """The module's stack without queued jobs, before and after: the claims here take any
    organization's, and the next test's claims must not find ours."""
    empty(bare_stack)
    yield bare_stack
    empty(bare_stack)


def reason_of(client, org: uuid.UUID, user, job_id: str) -> dict | None:  # type: ignore[no-untyped-def]
    answer = client.get(f"/api/v1/orgs/{org}/jobs/{job_id}", headers=user.auth)
    assert answer.status_code == 200, answer.get_json()
    return answer.get_json()["waiting_reason"]


def test_a_job_held_by_an_operators_rate_limit_says_until_when(quiet_stack: Stack):
    stack = quiet_stack
    client = stack.make_app().test_client()
    org = stack.org()
    anna = stack.user(org, role="owner")
    with stack.admin() as conn:
        accounts.set_rate_limit(conn, org, "bench.noop", RateLimit.parse("1 per hour"))
    first, second = (submit(client, org, anna, "bench.noop")["id"] for _ in range(2))
    assert reason_of(client, org, anna, second) is None  # nothing started yet: nothing holds it
    assert claim(stack, 10) == [first]

    held = reason_of(client, org, anna, second)
    (started,) = window_starts(stack, org, "bench.noop")
    assert held["reason"] == "rate_limit"
    assert datetime.fromisoformat(held["until"]) == started + timedelta(hours=1)
    assert held["words"].startswith("Queued behind its kind's rate limit until ")
    assert reason_of(client, org, anna, first) is None  # running: nothing holds it back
    # the list says the same, from one statement for the page
    listed = client.get(f"/api/v1/orgs/{org}/jobs", headers=anna.auth).get_json()["jobs"]
    assert {j["id"]: j["waiting_reason"] for j in listed}[second] == held
    # and the operators' list and job page say it in the same words
    operator = stack.operator()
    words = held["words"].split(" until ")[0]
    for url in (f"/ops/jobs?organization_id={org}", f"/ops/jobs/{second}"):
        page = html.unescape(client.get(url, headers=operator.auth).get_data(as_text=True))
        assert words in page, url


def test_a_kinds_declared_rate_limit_holds_the_fourth_job_until_the_oldest_start_leaves(
        quiet_stack: Stack):
    stack = quiet_stack
    client = stack.make_app().test_client()
    org = stack.org()
    anna = stack.user(org)
    jobs = [submit(client, org, anna, "test.rated")["id"] for _ in range(4)]  # 3 per 2 seconds
    assert len(claim(stack, 10)) == 3
    (fourth,) = [j for j in jobs if stack.job_row(j)["status"] == "queued"]
    held = reason_of(client, org, anna, fourth)
    assert held["reason"] == "rate_limit"
    assert datetime.fromisoformat(held["until"]) == min(window_starts(stack, org, "test.rated")) \
        + timedelta(seconds=2)


def test_a_job_of_a_sequence_names_the_job_it_waits_behind(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, password=PASSWORD)
    key = f"sequence-{uuid.uuid4().hex[:8]}"
    ids = [client.post(f"/api/v1/orgs/{org}/jobs", headers=anna.auth,
                       json={"kind": "bench.noop", "sequence_key": key,
                             "run_after": (datetime.now(UTC) + timedelta(hours=1)).isoformat()}
                       ).get_json()["id"] for _ in range(3)]
    # the first is only delayed; each later one waits behind the one right before it
    first = reason_of(client, org, anna, ids[0])
    assert first["reason"] == "delayed" and first["words"].startswith("Queued until ")
    assert [reason_of(client, org, anna, j)["behind"] for j in ids[1:]] == ids[:2]
    assert reason_of(client, org, anna, ids[2])["reason"] == "sequence"

    # the Python API says the same as the JSON, by the same names
    with stack.jobs.transaction(org, anna.id) as (conn, member):
        jobs = [stack.jobs.get(conn, member, uuid.UUID(j)) for j in ids]
        why = stack.jobs.why_waiting(conn, jobs)
    assert why[jobs[0].id].reason == "delayed"
    assert [why[job.id].behind for job in jobs[1:]] == [job.id for job in jobs[:2]]

    # and the job's page says it in words, naming the job before it with a link
    sign_in(client, anna)
    page = client.get(f"/orgs/{org}/jobs/{ids[1]}").get_data(as_text=True)
    assert f"Queued — after job {ids[0][:8]} of its sequence" in page
    assert f'href="/orgs/{org}/jobs/{ids[0]}"' in page


def test_a_delayed_job_says_until_when_on_its_page_and_in_the_list(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, password=PASSWORD)
    later = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=30)
    job = client.post(f"/api/v1/orgs/{org}/jobs", headers=anna.auth,
                      json={"kind": "bench.noop", "run_after": later.isoformat()}).get_json()
    held = job["waiting_reason"]  # the submit's answer says it too
    assert held["reason"] == "delayed" and datetime.fromisoformat(held["until"]) == later
    sign_in(client, anna)
    page = client.get(f"/orgs/{org}/jobs/{job['id']}").get_data(as_text=True)
    assert f"Queued — delayed until {later:%H:%M:%S} UTC" in page or \
        f"Queued — delayed until {later:%Y-%m-%d %H:%M:%S} UTC" in page
    listing = client.get(f"/orgs/{org}/jobs").get_data(as_text=True)
    assert "Queued until " in listing and "its start was put off" in listing


def test_the_web_role_learns_nothing_of_another_organizations_jobs(stack: Stack, client):
    org, other = stack.org(), stack.org()
    anna = stack.user(org)
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    job = client.post(f"/api/v1/orgs/{org}/jobs", headers=anna.auth,
                      json={"kind": "bench.noop", "run_after": later}).get_json()["id"]
    query = text("SELECT count(*) FROM queued_jobs_held(ARRAY[CAST(:id AS uuid)])")
    with transaction(stack.app_db, organization_id=org) as conn:
        assert conn.execute(query, {"id": job}).scalar_one() == 1
    with transaction(stack.app_db, organization_id=other) as conn:
        assert conn.execute(query, {"id": job}).scalar_one() == 0
    with transaction(stack.operator_db) as conn:  # operators see every organization's
        assert conn.execute(query, {"id": job}).scalar_one() == 1


def test_the_events_stream_says_why_a_job_waits_and_tells_when_the_reason_changes(stack: Stack):
    client = stack.make_app(EVENTS_POLL_SECONDS=0.1, EVENTS_MAX_SECONDS=3).test_client()
    org = stack.org()
    anna = stack.user(org)
    key = f"sequence-{uuid.uuid4().hex[:8]}"
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    first = client.post(f"/api/v1/orgs/{org}/jobs", headers=anna.auth, json={
        "kind": "bench.noop", "sequence_key": key, "run_after": later}).get_json()
    second = client.post(f"/api/v1/orgs/{org}/jobs", headers=anna.auth, json={
        "kind": "bench.noop", "sequence_key": key, "run_after": later}).get_json()
    response = client.get(second["links"]["events"], headers=anna.auth)
    chunks = (c.decode() if isinstance(c, bytes) else c for c in response.response)
    opening = ""
    while "event:" not in opening:
        opening += next(chunks)
    # the job before it is cancelled: the second is now only delayed, and the stream says so
    client.post(f"/api/v1/orgs/{org}/jobs/{first['id']}/cancel", headers=anna.auth)
    events = parse_events(opening + "".join(chunks))  # the stream ends after 3 s
    reasons = [data["waiting_reason"]["reason"] for _, data in events]
    assert reasons == ["sequence", "delayed"]
    assert events[0][1]["waiting_reason"]["behind"] == first["id"]
    assert [data["status"] for _, data in events] == ["queued", "queued"]
    client.post(f"/api/v1/orgs/{org}/jobs/{second['id']}/cancel", headers=anna.auth)
