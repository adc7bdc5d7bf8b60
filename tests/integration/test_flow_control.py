"""Flow control between tenants (docs/concepts/flow-control.md): rate limits per kind and
organization, sequences, debounce and fair shares by time, against real workers, the real claim
(claim_jobs() as the worker role) and the HTTP API."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.jobs.records import KindControl
from spacejobs.models.kinds import RateLimit
from spacejobs.models.tenancy import accounts, passwords
from tests.conftest import csrf_of, sign_in, submit
from tests.kit.seeding import TestUser
from tests.kit.servers import Servers
from tests.kit.stack import Stack, running_stack, wait_until

# -- helpers ---------------------------------------------------------------------------------

PASSWORD = "operator's long password"


@pytest.fixture()
def fresh_stack(servers: Servers, tmp_path: Path) -> Iterator[Stack]:
    """A database and queue of this test alone, with no process running."""
    with running_stack(servers, tmp_path) as built:
        yield built


def set_rate_limit(stack: Stack, org: uuid.UUID, kind: str, limit: str | None) -> None:
    with stack.admin() as conn:
        accounts.set_rate_limit(conn, org, kind, RateLimit.parse(limit) if limit else None)


def lease_times(stack: Stack, job_ids: list[str]) -> dict[str, list[datetime]]:
    """Every moment each job was leased (an attempt started), from its events."""
    with stack.admin() as conn:
        rows = conn.execute(text(
            "SELECT job_id::text, at FROM job_history WHERE to_status = 'leased'"
            " AND job_id = ANY (CAST(:ids AS uuid[])) ORDER BY at"), {"ids": job_ids}).all()
    found: dict[str, list[datetime]] = {job_id: [] for job_id in job_ids}
    for job_id, at in rows:
        found[job_id].append(at)
    return found


def most_in_any_window(moments: list[datetime], window: timedelta) -> int:
    """The most of ``moments`` inside any interval [t, t + window)."""
    ordered = sorted(moments)
    return max((sum(1 for m in ordered[i:] if m < start + window)
                for i, start in enumerate(ordered)), default=0)


def empty(stack: Stack) -> None:
    """No job of an earlier test in the module's database (claims below count every queued job)."""
    with stack.admin() as conn:
        conn.execute(text("DELETE FROM jobs"))


def flood(stack: Stack, org: uuid.UUID, user: uuid.UUID, count: int, kind: str = "bench.noop",
          ) -> list[str]:
    """Queued jobs as submit makes them, in bulk, through the owner role (test set-up)."""
    with stack.admin() as conn:
        return [str(r[0]) for r in conn.execute(text(
            "INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds, max_attempts)"
            " SELECT :org, :user, :kind, 30, 3 FROM generate_series(1, :n) RETURNING id"),
            {"org": org, "user": user, "n": count, "kind": kind})]


def claim(stack: Stack, limit: int, after: uuid.UUID = store.NO_ORGANIZATION) -> store.Claimed:
    with transaction(stack.worker_db, actor="worker:flow") as conn:
        return store.claim_batch(conn, "flow", limit=limit, after_organization=after)


def post(client, org: uuid.UUID, user: TestUser, body: dict):  # type: ignore[no-untyped-def]
    return client.post(f"/api/v1/orgs/{org}/jobs", json=body, headers=user.auth)


# -- rate limits -----------------------------------------------------------------------------


def test_a_window_never_lets_more_start_than_its_limit_across_two_workers(fresh_stack: Stack):
    stack = fresh_stack
    client = stack.make_app().test_client()
    limited, declared, free = stack.org(), stack.org(), stack.org()
    users = {org: stack.user(org, role="owner") for org in (limited, declared, free)}
    set_rate_limit(stack, limited, "bench.noop", "4 per 2 seconds")
    capped = [submit(client, limited, users[limited], "bench.noop")["id"] for _ in range(12)]
    # test.rated declares "3 per 2 seconds": without an operator's row, that applies
    rated = [submit(client, declared, users[declared], "test.rated")["id"] for _ in range(7)]
    others = [submit(client, free, users[free], "bench.noop")["id"] for _ in range(8)]
    for _ in range(2):
        stack.start_worker(concurrency=2)
    for job_id in others:
        stack.wait_for(job_id, "completed", timeout=20)
    others_done = time.monotonic()
    for job_id in capped + rated:
        stack.wait_for(job_id, "completed", timeout=30)
    capped_done = time.monotonic()

    starts = lease_times(stack, capped)
    moments = [at for times in starts.values() for at in times]
    assert len(moments) == 12
    assert most_in_any_window(moments, timedelta(seconds=2)) == 4
    # 12 at 4 per 2 s: three windows, so the last start is at least 4 s after the first
    assert max(moments) - min(moments) >= timedelta(seconds=4)
    rated_moments = [at for times in lease_times(stack, rated).values() for at in times]
    assert most_in_any_window(rated_moments, timedelta(seconds=2)) == 3
    # the other organization's jobs of the same kind were not held back behind the limit
    assert others_done < capped_done
    other_moments = [at for times in lease_times(stack, others).values() for at in times]
    assert max(other_moments) < min(moments) + timedelta(seconds=2)


def test_sixteen_claimers_at_once_lease_exactly_the_window(bare_stack: Stack):
    stack = bare_stack
    empty(stack)
    org = stack.org()
    user = stack.user(org).id
    flood(stack, org, user, 200)
    set_rate_limit(stack, org, "bench.noop", "50 per 60 seconds")
    taken: list[int] = []
    barrier = threading.Barrier(16)

    def claimer() -> None:
        barrier.wait()
        for _ in range(10):
            taken.append(len(claim(stack, 8)))

    threads = [threading.Thread(target=claimer) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(taken) == 50
    assert stack.job_counts(org)["queued"] == 150
    # nothing more however often they ask; the claim says when the window next opens
    again = claim(stack, 8)
    assert len(again) == 0
    assert again.window_opens_at is not None


def test_a_limit_lowered_while_jobs_wait_applies_to_the_next_claim(bare_stack: Stack):
    stack = bare_stack
    empty(stack)
    org = stack.org()
    flood(stack, org, stack.user(org).id, 30)
    set_rate_limit(stack, org, "bench.noop", "10 per 60 seconds")
    assert len(claim(stack, 6)) == 6
    set_rate_limit(stack, org, "bench.noop", "8 per 60 seconds")
    assert len(claim(stack, 6)) == 2  # 6 started in the window; the new limit leaves 2
    set_rate_limit(stack, org, "bench.noop", "5 per 60 seconds")
    assert len(claim(stack, 6)) == 0
    set_rate_limit(stack, org, "bench.noop", None)  # `default`: bench.noop declares none
    assert len(claim(stack, 6)) == 6
    assert stack.job_counts(org)["queued"] == 30 - 14


# -- sequences -------------------------------------------------------------------------------


def _spans(stack: Stack, job_ids: list[str]) -> list[tuple[datetime, datetime]]:
    """Each job's first lease and its end, in the order given."""
    spans = []
    for job_id in job_ids:
        row = stack.job_row(job_id)
        spans.append((min(lease_times(stack, [job_id])[job_id]), row["finished_at"]))
    return spans


def test_a_sequence_runs_one_at_a_time_in_submit_order_across_a_retry_and_a_cancel(
        stack: Stack, client):
    org = stack.org()
    owner = stack.user(org, role="owner")
    other = stack.org()
    stranger = stack.user(other, role="owner")
    key = {"sequence_key": "project-7/imports"}
    first = post(client, org, owner, {"kind": "test.stall", "params": {"seconds": 1.5}, **key})
    assert first.status_code == 202 and first.get_json()["sequence_key"] == "project-7/imports"
    ids = [first.get_json()["id"]]
    ids.append(post(client, org, owner, {"kind": "test.fails_once", **key}).get_json()["id"])
    cancelled = post(client, org, owner, {"kind": "bench.noop", **key}).get_json()["id"]
    ids.append(post(client, org, owner, {"kind": "test.stall", "params": {"seconds": 0.2},
                                         **key}).get_json()["id"])
    ids.append(post(client, org, owner, {"kind": "bench.noop", **key}).get_json()["id"])
    # the same key in another organization neither waits for nor orders this one's
    theirs = post(client, other, stranger, {"kind": "bench.noop", **key}).get_json()["id"]
    assert client.post(f"/api/v1/orgs/{org}/jobs/{cancelled}/cancel",
                       headers=owner.auth).status_code == 200
    stack.wait_for(theirs, "completed", timeout=10)
    assert stack.job_row(ids[0])["status"] == "leased"  # still running its 1.5 s
    for job_id in ids:
        stack.wait_for(job_id, "completed", timeout=30)
    assert stack.job_row(ids[1])["attempts"] == 2  # the retry ran before the next one began
    spans = _spans(stack, ids)
    for (_, ended), (began, _) in pairwise(spans):
        assert ended <= began
    assert stack.job_row(cancelled)["status"] == "cancelled"
    listed = client.get(f"/api/v1/orgs/{org}/jobs/{ids[0]}", headers=owner.auth).get_json()
    assert listed["sequence_key"] == "project-7/imports"


def test_a_killed_worker_holds_its_sequence_until_the_job_is_retried_and_ends(
        fresh_stack: Stack):
    stack = fresh_stack
    client = stack.make_app().test_client()
    org = stack.org()
    owner = stack.user(org, role="owner")
    key = {"sequence_key": "account-1/webhooks"}
    # test.stall's lease is 2 s: the SIGKILLed attempt's lease runs out, beat's sweeper puts it
    # back in the queue, and a new worker retries it
    killed = post(client, org, owner, {"kind": "test.stall", "params": {"seconds": 3,
                                                                         "retry_seconds": 0.1},
                                       **key}).get_json()["id"]
    after = post(client, org, owner, {"kind": "bench.noop", **key}).get_json()["id"]
    worker = stack.start_worker(concurrency=2)
    stack.wait_for(killed, "leased", timeout=10)
    worker.kill()  # SIGKILL, the whole process group
    stack.start_worker(concurrency=2)
    stack.start_beat()
    stack.wait_for(after, "completed", timeout=40)
    assert stack.job_row(killed)["status"] == "completed"
    assert stack.job_row(killed)["attempts"] == 2
    (_, killed_ended), (after_began, _) = _spans(stack, [killed, after])
    assert killed_ended <= after_began


def test_a_batch_takes_its_places_in_order(stack: Stack, client):
    org = stack.org()
    owner = stack.user(org, role="owner")
    body = {"jobs": [{"kind": "test.stall", "params": {"seconds": 0.1}, "sequence_key": "b"}
                     for _ in range(5)]}
    answer = client.post(f"/api/v1/orgs/{org}/jobs:batch", json=body, headers=owner.auth)
    assert answer.status_code == 202, answer.get_json()
    ids = [job["id"] for job in answer.get_json()["jobs"]]
    for job_id in ids:
        stack.wait_for(job_id, "completed", timeout=20)
    spans = _spans(stack, ids)
    for (_, ended), (began, _) in pairwise(spans):
        assert ended <= began


def test_a_sequence_key_must_be_1_to_200_characters(stack: Stack, client):
    org = stack.org()
    owner = stack.user(org, role="owner")
    for bad in ("", "x" * 201, 7):
        answer = post(client, org, owner, {"kind": "bench.noop", "sequence_key": bad})
        assert answer.status_code == 400, answer.get_json()
    assert stack.count_jobs(org) == 0


# -- debounce --------------------------------------------------------------------------------


def test_a_debounce_replaces_the_params_of_the_queued_job_and_moves_its_start(stack: Stack,
                                                                              client):
    org = stack.org()
    owner = stack.user(org, role="owner")
    member = stack.user(org, role="member")
    body = {"kind": "test.stall", "dedup_key": "sync", "debounce_seconds": 2}
    first = post(client, org, owner, {**body, "params": {"seconds": 0.1}})
    assert first.status_code == 202 and "debounced" not in first.get_json()
    job_id = first.get_json()["id"]
    time.sleep(0.5)
    second = post(client, org, member, {**body, "params": {"seconds": 0.2}})
    assert second.status_code == 202
    assert second.get_json()["id"] == job_id and second.get_json()["debounced"] is True
    row = stack.job_row(job_id)
    assert row["params"]["seconds"] == 0.2 and row["requested_by"] == member.id
    assert row["run_after"] >= row["created_at"] + timedelta(seconds=2.4)
    assert stack.count_jobs(org) == 1
    done = stack.wait_for(job_id, "completed", timeout=20)
    assert done["started_at"] >= row["run_after"]
    # it started: the next submit of the key is a new job
    third = post(client, org, owner, {**body, "params": {"seconds": 0}})
    assert third.status_code == 202 and third.get_json()["id"] != job_id
    # without debounce_seconds a queued duplicate is refused, as ever
    post(client, org, owner, {"kind": "bench.sleep", "params": {"seconds": 5}, "dedup_key": "d"})
    assert post(client, org, owner, {"kind": "bench.sleep", "params": {"seconds": 5},
                                     "dedup_key": "d"}).status_code == 409
    audit = [r["action"] for r in client.get(f"/api/v1/orgs/{org}/audit",
                                             headers=owner.auth).get_json()["entries"]]
    assert "job.debounce" in audit


def test_a_debounce_needs_a_dedup_key_and_a_sane_delay(stack: Stack, client):
    org = stack.org()
    owner = stack.user(org, role="owner")
    for body in ({"kind": "bench.noop", "debounce_seconds": 5},
                 {"kind": "bench.noop", "dedup_key": "k", "debounce_seconds": 0},
                 {"kind": "bench.noop", "dedup_key": "k", "debounce_seconds": 86_401},
                 {"kind": "bench.noop", "dedup_key": "k", "debounce_seconds": "5"}):
        answer = post(client, org, owner, body)
        assert answer.status_code == 400, (body, answer.get_json())
    batch = client.post(f"/api/v1/orgs/{org}/jobs:batch", headers=owner.auth, json={
        "jobs": [{"kind": "bench.noop", "dedup_key": "k", "debounce_seconds": 5}]})
    assert batch.status_code == 400  # a batch does not debounce
    assert stack.count_jobs(org) == 0


def test_a_debounce_that_races_a_claim_makes_a_new_job(bare_stack: Stack):
    """The claim holds the job's row when the debounce arrives: the debounce waits for it, finds
    the job started, and makes a new one; the claimed job keeps the params it was claimed with."""
    stack = bare_stack
    client = stack.make_app().test_client()
    org = stack.org()
    owner = stack.user(org, role="owner")
    body = {"kind": "bench.noop", "dedup_key": "race", "debounce_seconds": 1}
    first = post(client, org, owner, {**body}).get_json()["id"]
    with stack.admin() as conn:
        conn.execute(text("UPDATE jobs SET run_after = now() WHERE id = :id"), {"id": first})
    answers: list = []
    with stack.worker_db.connect() as conn, conn.begin():
        conn.execute(text("SET LOCAL app.actor = 'worker:race'"))
        taken = store.claim_batch(conn, "race", limit=1)
        assert [str(job.id) for job in taken] == [first]
        racer = threading.Thread(target=lambda: answers.append(post(client, org, owner, body)))
        racer.start()
        time.sleep(0.5)
        assert racer.is_alive()  # the debounce waits for the claim's row lock
    racer.join(timeout=10)
    answer = answers[0]
    assert answer.status_code == 202 and answer.get_json()["id"] != first
    assert "debounced" not in answer.get_json()
    assert stack.job_row(first)["status"] == "leased"


# -- fair shares by time ---------------------------------------------------------------------


def test_the_claim_goes_first_to_whoever_runs_the_least_per_weight_and_reads_weights_live(
        bare_stack: Stack):
    stack = bare_stack
    empty(stack)
    busy, quiet = sorted([stack.org(), stack.org()])  # busy comes first in the ring
    flood(stack, busy, stack.user(busy).id, 20)
    flood(stack, quiet, stack.user(quiet).id, 20)
    # busy already runs three jobs (long ones: they hold their slots)
    running = claim(stack, 3, after=store.NO_ORGANIZATION)
    assert {job.organization_id for job in running} <= {busy, quiet}
    counts = {org: sum(1 for job in running if job.organization_id == org) for org in (busy, quiet)}
    # whoever ran fewer gets the next slot, whatever the ring's order
    nxt = claim(stack, 1)
    fewer = min(counts, key=lambda org: (counts[org], org))
    assert [job.organization_id for job in nxt] == [fewer]
    # a weight is read at every claim: weighted 10, the organization that runs more goes first
    more = busy if fewer == quiet else quiet
    with stack.admin() as conn:
        accounts.set_claim_weight(conn, more, 10)
    assert [job.organization_id for job in claim(stack, 1)] == [more]


# -- operators -------------------------------------------------------------------------------


def test_operators_set_a_rate_limit_on_the_dashboard_and_it_is_audited(stack: Stack, client):
    org = stack.org()
    owner = stack.user(org, role="owner")
    operator = stack.operator()
    url = "/ops/api/rate-limits"
    form = {"organization_id": str(org), "kind": "bench.noop", "limit": "50 per 10 seconds"}
    assert client.post(url, json=form, headers=owner.auth).status_code == 404
    assert client.post(url, json={**form, "limit": "fifty"},
                       headers=operator.auth).status_code == 400
    assert client.post(url, json=form, headers=operator.auth).status_code == 200
    with stack.admin() as conn:
        row = conn.execute(text("SELECT max_starts, per_seconds FROM job_rate_limits"
                                " WHERE organization_id = :o"), {"o": org}).one()
        audit = conn.execute(text("SELECT detail FROM operator_audit WHERE action = 'rate_limit'"
                                  " AND target = :o ORDER BY id"), {"o": str(org)}).scalars().all()
    assert tuple(row) == (50, 10)
    assert audit[-1] == {"kind": "bench.noop", "max_starts": 50, "per_seconds": 10}
    overview = client.get("/ops/api/overview", headers=operator.auth).get_json()
    assert [(r["kind"], r["max_starts"]) for r in overview["rate_limits"]
            if r["organization_id"] == str(org)] == [("bench.noop", 50)]
    assert client.post(url, json={**form, "limit": "default"},
                       headers=operator.auth).status_code == 200
    with stack.admin() as conn:
        assert conn.execute(text("SELECT count(*) FROM job_rate_limits WHERE organization_id = :o"),
                            {"o": org}).scalar_one() == 0


def rate_limit_writes(stack: Stack) -> tuple[int, int]:
    """How many rate limits and rate-limit lines of the operator audit log there are."""
    with stack.admin() as conn:
        counts = conn.execute(text(
            "SELECT (SELECT count(*) FROM job_rate_limits),"
            " (SELECT count(*) FROM operator_audit WHERE action = 'rate_limit')")).one()
    return counts[0], counts[1]


def test_an_operator_naming_an_unknown_organization_gets_a_400_and_nothing_is_written(
        stack: Stack, app, client):
    """Attack (operator): a rate limit for an organization that does not exist answered 500 (a
    foreign-key violation out of set_rate_limit()), and its removal wrote an audit line for it.
    Through the JSON API and through the overview's form, signed in."""
    operator = stack.operator()
    url = "/ops/api/rate-limits"
    before = rate_limit_writes(stack)
    refused = {"code": "invalid_request", "message": "There is no organization with that id.",
               "fields": ["organization_id"]}
    answers = [client.post(url, headers=operator.auth, json={
        "organization_id": organization_id, "kind": "bench.noop", "limit": limit})
        for organization_id, limit in ((str(uuid.uuid4()), "50 per 10 seconds"),
                                       (str(uuid.uuid4()), "default"), ("not-an-id", "1 per minute"))]
    print("answered:", [(a.status_code, a.get_json().get("error", {}).get("code")) for a in answers],
          "rate limits and their audit lines (before, after):", (before, rate_limit_writes(stack)))
    assert [(a.status_code, a.get_json().get("error")) for a in answers] == [(400, refused)] * 3
    browser = app.test_client()
    with stack.admin() as conn:
        passwords.set_password(conn, operator.id, PASSWORD)
    sign_in(browser, TestUser(operator.id, operator.email, operator.token, PASSWORD))
    page = browser.post(url, data={"csrf": csrf_of(browser.get("/ops")),
                                   "organization_id": str(uuid.uuid4()), "kind": "bench.noop",
                                   "limit": "50 per 10 seconds"}, headers={"Accept": "text/html"})
    assert (page.status_code, refused["message"] in page.get_data(as_text=True)) == (400, True)
    assert rate_limit_writes(stack) == before


def test_an_organization_deleted_while_its_rate_limit_is_set_gets_the_same_400(
        stack: Stack, app):
    """The race the check before set_rate_limit() cannot close: the organization is deleted
    between the check and the insert, whose foreign key then refuses it."""
    org = stack.org()
    operator = stack.operator()
    before = rate_limit_writes(stack)
    answers: list = []
    form = {"organization_id": str(org), "kind": "bench.noop", "limit": "50 per 10 seconds"}
    with stack.admin_db.connect() as deleting:
        deleting.execute(text("DELETE FROM organizations WHERE id = :o"), {"o": org})
        xid = deleting.execute(text(
            "SELECT (pg_current_xact_id()::text::bigint % 4294967296)::text")).scalar_one()
        # The web's transaction sees the organization (the delete is not committed) and its
        # insert waits on the deleting transaction until it commits.
        poster = threading.Thread(target=lambda: answers.append(app.test_client().post(
            "/ops/api/rate-limits", json=form, headers=operator.auth)))
        poster.start()
        with stack.admin() as conn:
            wait_until(lambda: conn.execute(text(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'"
                " AND transactionid::text = :xid"), {"xid": xid}).scalar_one() > 0, 4,
                "the web's set_rate_limit() waiting on the deleted organization")
        deleting.commit()
        poster.join(10)
    error = answers[0].get_json()["error"]
    assert (answers[0].status_code, error["code"], error.get("fields")) == (
        400, "invalid_request", ["organization_id"])
    assert rate_limit_writes(stack) == before


def test_the_cli_sets_and_removes_a_rate_limit(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    ok = stack.cli("orgs", "set-rate-limit", str(org), "bench.noop", "10 per minute")
    assert ok.returncode == 0, ok.stderr
    with stack.admin() as conn:
        assert tuple(conn.execute(text(
            "SELECT max_starts, per_seconds FROM job_rate_limits WHERE organization_id = :o"),
            {"o": org}).one()) == (10, 60)
    bad = stack.cli("orgs", "set-rate-limit", str(org), "bench.noop", "ten a minute")
    assert bad.returncode == 2 and "N per S seconds" in bad.stderr
    assert stack.cli("orgs", "set-rate-limit", str(org), "bench.noop", "default").returncode == 0
    with stack.admin() as conn:
        assert conn.execute(text("SELECT count(*) FROM job_rate_limits WHERE organization_id = :o"),
                            {"o": org}).scalar_one() == 0


# -- attacks, as the real roles --------------------------------------------------------------


def test_the_web_role_cannot_set_a_rate_limit_without_naming_an_operator(stack: Stack):
    """space_app may call set_rate_limit() (the dashboard does); naming a member instead of an
    operator is refused, and it can write job_rate_limits no other way."""
    org = stack.org()
    member = stack.user(org, role="owner")
    for sql in ("SELECT set_rate_limit(:user, :org, 'bench.noop', 1000, 1, NULL)",
                "SELECT put_rate_limit(:org, 'bench.noop', 1000, 1)",
                "INSERT INTO job_rate_limits (organization_id, kind, max_starts, per_seconds)"
                " VALUES (:org, 'bench.noop', 1000, 1)"):
        with pytest.raises(DBAPIError) as failure, \
                transaction(stack.app_db, organization_id=org, user_id=member.id) as conn:
            conn.execute(text(sql), {"user": member.id, "org": org})
        assert "permission denied" in str(failure.value.orig) \
            or "only an operator" in str(failure.value.orig)
    with stack.admin() as conn:
        assert conn.execute(text("SELECT count(*) FROM job_rate_limits WHERE organization_id = :o"),
                            {"o": org}).scalar_one() == 0


def test_a_debounced_job_that_started_keeps_its_params(stack: Stack, client):
    """The transition trigger lets a debounce change params only while the job is queued and
    never started: not once leased, even as the owner."""
    org = stack.org()
    owner = stack.user(org, role="owner")
    job_id = post(client, org, owner, {"kind": "bench.sleep", "params": {"seconds": 5},
                                       "dedup_key": "held", "debounce_seconds": 1}).get_json()["id"]
    stack.wait_for(job_id, "leased", timeout=20)
    with pytest.raises(DBAPIError) as failure, stack.admin() as conn:
        conn.execute(text("UPDATE jobs SET params = '{\"seconds\": 0}' WHERE id = :id"),
                     {"id": job_id})
    assert "snapshot is immutable" in str(failure.value.orig)
    assert stack.job_row(job_id)["params"]["seconds"] == 5


def test_a_paused_kind_is_not_claimed_through_its_rate_limit(bare_stack: Stack):
    stack = bare_stack
    empty(stack)
    org = stack.org()
    flood(stack, org, stack.user(org).id, 5)
    set_rate_limit(stack, org, "bench.noop", "10 per 60 seconds")
    paused = [KindControl("bench.noop", True, None)]
    with transaction(stack.worker_db, actor="worker:flow") as conn:
        assert len(store.claim_batch(conn, "flow", limit=5, controls=paused)) == 0
    assert len(claim(stack, 5)) == 5
