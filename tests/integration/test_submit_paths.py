"""Submitting from Python (in the caller's transaction) and in bulk over HTTP: what is written,
what is refused, and when the wake-up goes out."""

from __future__ import annotations

import io
import threading
import time
import uuid
import zipfile
from datetime import UTC, datetime

import psycopg
import pytest
from sqlalchemy import text

from spacejobs.models.db.engine import make_engine
from spacejobs.models.errors import (
    DuplicateJob,
    InvalidParams,
    InvalidRequest,
    NotFound,
    RequesterNotMember,
    UnknownKind,
)
from spacejobs.models.jobs import service
from spacejobs.models.jobs.service import Jobs
from tests.kit.stack import Stack


def test_submit_in_the_callers_transaction_wakes_only_after_commit(stack: Stack, app_db):
    org = stack.org()
    anna = stack.user(org, role="owner")
    seen: list[tuple[str, int]] = []

    def wake(job_id: str | None) -> None:
        # What another connection sees at the moment the wake-up goes out.
        seen.append((job_id, stack.count_jobs(org)))

    with app_db.begin() as conn:
        job = Jobs(conn.engine, wake=wake).submit(conn, "bench.noop", {}, organization_id=org,
                                                  requested_by=anna.id).job
        assert seen == []  # not yet: the row is not committed
    assert seen == [(str(job.id), 1)]
    stack.wait_for(job.id, "completed")


def test_a_rollback_after_submit_leaves_no_row_and_sends_nothing(stack: Stack, app_db):
    org = stack.org()
    anna = stack.user(org, role="owner")
    seen: list[str | None] = []
    with pytest.raises(RuntimeError), app_db.begin() as conn:
        Jobs(conn.engine, wake=seen.append).submit(conn, "bench.noop", {}, organization_id=org,
                                                   requested_by=anna.id)
        raise RuntimeError("the caller changes its mind")
    assert seen == [] and stack.count_jobs(org) == 0


def test_enqueue_commits_one_job_in_one_statement_then_wakes(stack: Stack, app_db, monkeypatch):
    org = stack.org()
    anna = stack.user(org, role="owner")
    seen: list[tuple[str | None, int]] = []
    statements: list[tuple[str, bool, object]] = []

    def wake(job_id: str | None) -> None:
        seen.append((job_id, stack.count_jobs(org)))

    # What the driver is asked to run, whether through SQLAlchemy or on its cursor directly
    # (models/db/hot.py); psycopg sends BEGIN and COMMIT itself only outside autocommit.
    execute = psycopg.Cursor.execute

    def executed(cursor, query, *args, **kwargs):
        statements.append((str(query), cursor.connection.autocommit, cursor.connection))
        return execute(cursor, query, *args, **kwargs)

    # A pooled connection that has been opened already: opening one reads the server's
    # version and types, which is not the submit's work.
    Jobs(app_db, wake=lambda _job_id: None).enqueue("bench.noop", {}, organization_id=org,
                                                     requested_by=anna.id)
    jobs = Jobs(app_db, wake=wake)
    monkeypatch.setattr(psycopg.Cursor, "execute", executed)
    submitted = jobs.enqueue("bench.noop", {}, organization_id=org, requested_by=anna.id)
    monkeypatch.undo()
    # The submit alone, as a transaction of its own (no BEGIN or COMMIT round trips), and the
    # wake-up once another connection sees the row.
    (submitting,) = {conn for query, _, conn in statements if "submit_job" in query}
    assert [(autocommit, "submit_job" in query) for query, autocommit, conn in statements
            if conn is submitting] == [(True, True)]
    assert submitted.created and seen == [(str(submitted.job.id), 2)]
    stack.wait_for(submitted.job.id, "completed")

    # The pooled connection goes back to transactions: a rollback still discards a submit.
    with pytest.raises(RuntimeError), app_db.begin() as conn:
        jobs.submit(conn, "bench.noop", {}, organization_id=org, requested_by=anna.id)
        raise RuntimeError("the caller changes its mind")
    assert stack.count_jobs(org) == 2 and len(seen) == 1


def test_enqueue_refuses_like_submit_and_writes_nothing(stack: Stack, app_db):
    org = stack.org()
    stranger = stack.user(stack.org(), role="owner")
    seen: list[str | None] = []
    with pytest.raises(NotFound):
        Jobs(app_db, wake=seen.append).enqueue("bench.noop", {}, organization_id=org,
                                               requested_by=stranger.id)
    with pytest.raises(InvalidParams):
        Jobs(app_db, wake=seen.append).enqueue("bench.sleep", {"seconds": 600},
                                               organization_id=org, requested_by=stranger.id)
    assert seen == [] and stack.count_jobs(org) == 0


@pytest.mark.parametrize("kind, params, error", [
    ("no.such.kind", {}, UnknownKind),
    ("bench.sleep", {"seconds": 600}, InvalidParams),
])
def test_python_submit_refuses_like_the_api(stack: Stack, app_db, kind, params, error):
    org = stack.org()
    anna = stack.user(org, role="owner")
    with pytest.raises(error), app_db.begin() as conn:
        Jobs(conn.engine).submit(conn, kind, params, organization_id=org, requested_by=anna.id)
    assert stack.count_jobs(org) == 0


def test_python_submit_checks_the_requesters_current_membership(stack: Stack, app_db):
    org = stack.org()
    stranger = stack.user(stack.org(), role="owner")
    with pytest.raises(Exception) as refused, app_db.begin() as conn:
        Jobs(conn.engine).submit(conn, "bench.noop", {}, organization_id=org, requested_by=stranger.id)
    assert not isinstance(refused.value, RequesterNotMember)  # a web refusal: not found
    assert getattr(refused.value, "code", None) == "not_found"
    assert stack.count_jobs(org) == 0


def test_a_batch_is_accepted_whole_in_the_order_given(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    body = {"jobs": [{"kind": "bench.noop"}, {"kind": "bench.sleep", "params": {"seconds": 0}},
                     {"kind": "bench.noop", "dedup_key": "nightly"}]}
    answer = client.post(f"/api/v1/orgs/{org}/jobs:batch", json=body, headers=anna.auth)
    assert answer.status_code == 202, answer.get_json()
    jobs = answer.get_json()["jobs"]
    assert [j["kind"] for j in jobs] == ["bench.noop", "bench.sleep", "bench.noop"]
    assert all(j["status"] == "queued" and j["organization_id"] == str(org) for j in jobs)
    for job in jobs:
        stack.wait_for(job["id"], "completed")


@pytest.mark.parametrize("jobs, status, code, index", [
    ([{"kind": "bench.noop"}, {"kind": "bench.sleep", "params": {"seconds": -1}}],
     400, "invalid_params", 1),
    ([{"kind": "bench.noop"}, {"kind": "bench.noop"}, {"kind": "nope"}], 400, "unknown_kind", 2),
    ([{"kind": "bench.noop", "dedup_key": "k"}, {"kind": "bench.noop", "dedup_key": "k"}],
     409, "duplicate_job", 1),
])
def test_a_refused_batch_names_the_item_and_writes_nothing(stack: Stack, client, jobs, status,
                                                           code, index):
    org = stack.org()
    anna = stack.user(org, role="owner")
    answer = client.post(f"/api/v1/orgs/{org}/jobs:batch", json={"jobs": jobs}, headers=anna.auth)
    assert answer.status_code == status
    error = answer.get_json()["error"]
    assert (error["code"], error["index"]) == (code, index)
    assert stack.count_jobs(org) == 0


@pytest.mark.parametrize("role, state, status, code", [
    ("member", "active", 403, "insufficient_role"),   # an import needs an admin
    ("owner", "read_only", 409, "organization_read_only"),  # an import writes
])
def test_a_batch_refused_by_one_kinds_rules_names_that_item_and_its_reason(
        stack: Stack, client, role: str, state: str, status: int, code: str):
    """Attack: a member's batch of an export and an import answered 409 organization_unavailable
    at index 0 (the export, which they may run) instead of 403 insufficient_role at index 1."""
    org = stack.org(state=state)
    anna = stack.user(org, role=role)
    body = {"jobs": [{"kind": "projects_export"},
                     {"kind": "projects_import", "params": {"projects": [{"name": "a"}]}}]}
    answer = client.post(f"/api/v1/orgs/{org}/jobs:batch", json=body, headers=anna.auth)
    error = answer.get_json()["error"]
    assert (answer.status_code, error["code"], error["index"]) == (status, code, 1)
    assert stack.count_jobs(org) == 0


def test_a_batch_meeting_an_active_duplicate_is_refused_whole(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    url = f"/api/v1/orgs/{org}/jobs"
    with stack.workers_paused():
        first = client.post(url, json={"kind": "bench.noop", "dedup_key": "daily"},
                            headers=anna.auth).get_json()
        answer = client.post(url + ":batch", headers=anna.auth, json={"jobs": [
            {"kind": "bench.noop"}, {"kind": "bench.noop", "dedup_key": "daily"}]})
        assert answer.status_code == 409
        error = answer.get_json()["error"]
        assert (error["code"], error["index"], error["job_id"]) == ("duplicate_job", 1, first["id"])
        assert stack.count_jobs(org) == 1  # only the first submit's row


@pytest.mark.parametrize("body", [
    {"jobs": []},
    {"jobs": [{"kind": "bench.noop"}] * 1001},
    {"jobs": [{"kind": "bench.noop", "organization_id": str(uuid.uuid4())}]},
    {"jobs": [{"kind": "bench.noop"}], "requested_by": str(uuid.uuid4())},
])
def test_a_malformed_batch_is_a_400(stack: Stack, client, body):
    org = stack.org()
    anna = stack.user(org, role="owner")
    answer = client.post(f"/api/v1/orgs/{org}/jobs:batch", json=body, headers=anna.auth)
    assert answer.status_code == 400 and answer.get_json()["error"]["code"] == "invalid_request"
    assert stack.count_jobs(org) == 0


def test_python_submit_many_is_all_or_nothing_inside_a_savepoint(stack: Stack, app_db):
    org = stack.org()
    anna = stack.user(org, role="owner")
    with app_db.begin() as conn:
        Jobs(conn.engine).submit(conn, "bench.noop", {}, organization_id=org, requested_by=anna.id,
                       dedup_key="taken")
        with pytest.raises(DuplicateJob) as refused:
            Jobs(conn.engine).submit_many(conn, [service.JobRequest("bench.noop"),
                                       service.JobRequest("bench.noop", dedup_key="taken")],
                                organization_id=org, requested_by=anna.id)
        assert refused.value.details["index"] == 1
        # The caller's own earlier write survives; none of the batch's rows do.
    assert stack.count_jobs(org) == 1


def test_simultaneous_submits_with_one_dedup_key_give_one_job(stack: Stack):
    """Eight transactions submit the same dedup key at the same moment, each on its own
    connection: the unique index makes all but one wait for the first's COMMIT and then answer
    the duplicate. Workers are frozen so the first job stays active (a finished one frees the key)."""
    org = stack.org()
    anna = stack.user(org, role="owner")
    engine = make_engine(stack.app_url, pool_size=8)
    start = threading.Barrier(8)
    created: list[uuid.UUID] = []
    duplicates: list[str] = []

    def one() -> None:
        start.wait()
        try:
            with engine.begin() as conn:
                job = Jobs(conn.engine).submit(conn, "bench.noop", {}, organization_id=org,
                                     requested_by=anna.id, dedup_key="nightly").job
                time.sleep(0.05)  # hold the row uncommitted while the others arrive
            created.append(job.id)
        except DuplicateJob as refused:
            duplicates.append(refused.details["job_id"])

    try:
        with stack.workers_paused():
            threads = [threading.Thread(target=one) for _ in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=30)
            assert len(created) == 1 and len(duplicates) == 7
            assert set(duplicates) == {str(created[0])}
            assert stack.count_jobs(org) == 1
    finally:
        engine.dispose()


# ------------------------------------------------------------------------- get, cancel, running, wait

def test_wait_returns_the_finished_job_and_its_result_soon_after_the_finish(stack: Stack, app_db):
    org = stack.org()
    anna = stack.user(org, role="owner")
    with app_db.begin() as conn:
        job = Jobs(conn.engine).submit(conn, "bench.sleep", {"seconds": 0.5}, organization_id=org,
                             requested_by=anna.id).job
    outcome = stack.jobs.wait(job.id, 20, organization_id=org)
    returned = datetime.now(UTC)
    assert outcome.job.status == "completed" and outcome.result == {"slept": 0.5}
    # The finish's COMMIT notifies; the waiter re-reads the row and returns.
    assert (returned - outcome.job.finished_at).total_seconds() < 0.25


def test_wait_names_the_file_of_a_result_in_the_results_store(stack: Stack, app_db):
    org = stack.org()
    anna = stack.user(org, role="owner")
    with app_db.begin() as conn:
        job = Jobs(conn.engine).submit(conn, "projects_archive", {}, organization_id=org,
                             requested_by=anna.id).job
    outcome = stack.jobs.wait(job.id, 20, organization_id=org)
    assert outcome.job.status == "completed"
    assert outcome.stored is not None and outcome.stored.key == stack.job_row(job.id)["result_ref"]
    assert outcome.result["stored"]["content_type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(b"".join(stack.results().open(outcome.stored.key).chunks()))) as z:
        assert "manifest.json" in z.namelist()


def test_wait_times_out_and_does_not_see_other_organizations(stack: Stack, app_db):
    org = stack.org()
    anna = stack.user(org, role="owner")
    # One pause for the submit and the wait: in a gap between two, a worker that lingers on
    # LISTEN (or its floor) takes the job at once.
    with stack.workers_paused():
        with app_db.begin() as conn:
            job = Jobs(conn.engine).submit(conn, "bench.noop", {}, organization_id=org,
                                           requested_by=anna.id).job
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            stack.jobs.wait(job.id, 0.5, organization_id=org)
        assert 0.5 <= time.monotonic() - started < 2
    with pytest.raises(NotFound):
        stack.jobs.wait(job.id, 1, organization_id=stack.org())


def test_get_running_and_cancel_from_python(stack: Stack, app_db):
    org = stack.org()
    anna = stack.user(org, role="owner")
    with app_db.begin() as conn:
        job = Jobs(conn.engine).submit(conn, "bench.sleep", {"seconds": 10}, organization_id=org,
                             requested_by=anna.id).job
    stack.wait_for(job.id, "leased")
    jobs = Jobs(app_db)
    with app_db.begin() as conn:
        member = jobs.member(conn, org, anna.id)
        assert [j.id for j in jobs.running(conn, member)] == [job.id]
        assert jobs.running(conn, member, kind="bench.noop") == []
        asked = jobs.cancel(conn, member, job.id)
    other = stack.org()
    stranger = stack.user(other)
    with app_db.begin() as conn, pytest.raises(NotFound):  # another tenant's member never sees it
        jobs.get(conn, jobs.member(conn, other, stranger.id), job.id)
    assert asked.status == "cancel_requested"
    assert stack.jobs.wait(job.id, 20, organization_id=org).job.status == "cancelled"


# ------------------------------------------------------------------------- priority

def _priorities(stack: Stack, org) -> dict[str, int]:
    with stack.admin() as conn:
        return {str(row.id): row.priority for row in conn.execute(
            text("SELECT id, priority FROM jobs WHERE organization_id = :org"), {"org": org})}


def test_priority_from_the_api_the_batch_and_python_lands_on_the_row(stack: Stack, client, app_db):
    org = stack.org()
    anna = stack.user(org, role="owner")
    url = f"/api/v1/orgs/{org}/jobs"
    with stack.workers_paused():
        one = client.post(url, json={"kind": "bench.noop", "priority": 7}, headers=anna.auth)
        batch = client.post(url + ":batch", json={"jobs": [
            {"kind": "bench.noop", "priority": -3}, {"kind": "bench.noop"}]}, headers=anna.auth)
        with app_db.begin() as conn:
            python = Jobs(conn.engine).submit(conn, "bench.noop", {}, organization_id=org,
                                    requested_by=anna.id, priority=10).job
        assert one.status_code == 202 and batch.status_code == 202
        low, default = (job["id"] for job in batch.get_json()["jobs"])
        assert _priorities(stack, org) == {one.get_json()["id"]: 7, low: -3, default: 0,
                                           str(python.id): 10}


@pytest.mark.parametrize("priority", [11, -11, 2.5, "high", True])
def test_a_priority_out_of_range_is_a_400_and_writes_nothing(stack: Stack, client, app_db, priority):
    org = stack.org()
    anna = stack.user(org, role="owner")
    answer = client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": "bench.noop", "priority": priority},
                         headers=anna.auth)
    assert answer.status_code == 400 and answer.get_json()["error"]["code"] == "invalid_request"
    batch = client.post(f"/api/v1/orgs/{org}/jobs:batch", json={"jobs": [
        {"kind": "bench.noop"}, {"kind": "bench.noop", "priority": priority}]}, headers=anna.auth)
    assert batch.status_code == 400
    if isinstance(priority, int) and not isinstance(priority, bool):
        with pytest.raises(InvalidRequest), app_db.begin() as conn:
            Jobs(conn.engine).submit(conn, "bench.noop", {}, organization_id=org, requested_by=anna.id,
                           priority=priority)
    assert stack.count_jobs(org) == 0


# -- a single submit is a batch of one ----------------------------------------------------------

SAME_ROW = text("SELECT to_jsonb(j) - ARRAY['id', 'created_at', 'updated_at', 'last_wakeup_at',"
                " 'sequence_position']"
                " FROM jobs j WHERE j.id = :id")
SAME_EVENTS = text("SELECT from_status, to_status, attempt, actor FROM job_history"
                   " WHERE job_id = :id ORDER BY id")
# the one difference a batch keeps on purpose: its entries say they came in a bulk request
SAME_AUDIT = text("SELECT action, actor_id, actor, detail - 'bulk', detail ? 'bulk', request_id"
                  " FROM org_audit WHERE job_id = :id ORDER BY id")


def written(stack: Stack, job_id: uuid.UUID) -> tuple:
    with stack.admin() as conn:
        return (conn.execute(SAME_ROW, {"id": job_id}).scalar_one(),
                conn.execute(SAME_EVENTS, {"id": job_id}).all(),
                [tuple(r) for r in conn.execute(SAME_AUDIT, {"id": job_id}).all()])


def test_a_single_submit_and_a_batch_of_one_write_the_same_rows_events_and_wake_up(
        bare_stack: Stack):
    stack = bare_stack  # no worker: the jobs stay as the submits left them
    org = stack.org()
    anna = stack.user(org, role="owner")
    later = datetime(2099, 1, 1, tzinfo=UTC)
    request = service.JobRequest("bench.sleep", {"seconds": 0.5}, run_after=later, priority=3,
                                 sequence_key="nightly")
    woken: list[str | None] = []
    jobs = Jobs(stack.app_db, wake=woken.append)
    with jobs.transaction(org, anna.id) as (conn, _):
        one = jobs.submit(conn, request.kind, request.params, organization_id=org,
                          requested_by=anna.id, run_after=later, priority=3,
                          sequence_key="nightly", request_id="req-same").job
    with jobs.transaction(org, anna.id) as (conn, _):
        (batch_of_one,) = jobs.submit_many(conn, [request], organization_id=org,
                                           requested_by=anna.id, request_id="req-same")
    assert woken == [str(one.id), str(batch_of_one.id)]

    row, events, audit = written(stack, one.id)
    other_row, other_events, other_audit = written(stack, batch_of_one.id)
    assert {column for column in row if row[column] != other_row[column]} == set()
    assert events == other_events
    assert row["params"] == {"seconds": 0.5} and row["status"] == "queued"
    assert events == [(None, "queued", 0, f"user:{anna.id}")]
    assert audit == [("job.submit", anna.id, f"user:{anna.id}", {"kind": "bench.sleep"}, False,
                      "req-same")]
    assert other_audit == [(*audit[0][:4], True, "req-same")]


def test_over_http_a_single_submit_and_a_batch_of_one_answer_the_same_job(bare_stack: Stack):
    stack = bare_stack
    client = stack.make_app().test_client()
    org = stack.org()
    anna = stack.user(org, role="owner")
    body = {"kind": "bench.sleep", "params": {"seconds": 0.5}, "priority": -2,
            "run_after": "2099-01-01T00:00:00+00:00", "dedup_key": "same"}
    single = client.post(f"/api/v1/orgs/{org}/jobs", json=body, headers=anna.auth)
    # the same dedup key while the first is active: the batch's refusal is the single's, at 0
    refused = client.post(f"/api/v1/orgs/{org}/jobs:batch", json={"jobs": [body]},
                          headers=anna.auth)
    assert single.status_code == 202 and refused.status_code == 409
    error = refused.get_json()["error"]
    assert (error["code"], error["index"], error["job_id"]) == ("duplicate_job", 0,
                                                                 single.get_json()["id"])
    batch = client.post(f"/api/v1/orgs/{org}/jobs:batch",
                        json={"jobs": [{**body, "dedup_key": "other"}]}, headers=anna.auth)
    assert batch.status_code == 202

    def shown(job: dict) -> dict:
        return {k: v for k, v in job.items()
                if k not in ("id", "links", "created_at", "updated_at")}
    (from_batch,) = batch.get_json()["jobs"]
    assert shown(from_batch) == shown(single.get_json())


def test_a_submit_that_meets_a_waiting_job_of_its_dedup_key_names_that_job(stack: Stack, client):
    """A waiting job is active: its dedup key refuses a second one, and the refusal names it
    (the single submit's lookup once missed a waiting job and answered no job_id)."""
    org = stack.org()
    anna = stack.user(org, role="owner")
    body = {"kind": "bench.await_signal", "params": {"name": "go", "timeout": 60},
            "dedup_key": "the-one"}
    first = client.post(f"/api/v1/orgs/{org}/jobs", json=body, headers=anna.auth).get_json()
    stack.wait_for(first["id"], "waiting")
    for url, sent in ((f"/api/v1/orgs/{org}/jobs", body),
                      (f"/api/v1/orgs/{org}/jobs:batch", {"jobs": [body]})):
        again = client.post(url, json=sent, headers=anna.auth)
        assert again.status_code == 409, again.get_json()
        assert again.get_json()["error"]["job_id"] == first["id"]
    client.post(f"/api/v1/orgs/{org}/jobs/{first['id']}/signals/go", json=None, headers=anna.auth)
    stack.wait_for(first["id"], "completed")


def test_a_batch_debounces_each_job_as_a_single_submit_does(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    jobs = Jobs(stack.app_db)
    first = service.JobRequest("bench.sleep", {"seconds": 0.1}, dedup_key="settle",
                               debounce_seconds=600)
    with jobs.transaction(org, anna.id) as (conn, _):
        made = jobs.submit_request(conn, first, organization_id=org, requested_by=anna.id)
    later = service.JobRequest("bench.sleep", {"seconds": 0.2}, dedup_key="settle",
                               debounce_seconds=600)
    with jobs.transaction(org, anna.id) as (conn, _):
        debounced, other = jobs.submit_many(conn, [later, service.JobRequest("bench.noop")],
                                            organization_id=org, requested_by=anna.id)
    assert made.created and debounced.id == made.job.id and other.id != made.job.id
    with stack.admin() as conn:
        params = conn.execute(text("SELECT params FROM jobs WHERE id = :id"),
                              {"id": made.job.id}).scalar_one()
        actions = conn.execute(text("SELECT action FROM org_audit WHERE organization_id = :org"
                                    " AND action LIKE 'job.%' ORDER BY id"), {"org": org}).scalars().all()
    assert params == {"seconds": 0.2}
    assert actions == ["job.submit", "job.debounce", "job.submit"]
