"""Faults across processes: a stalled worker, failing attempts, a lost broker, a locked database,
and the tenancy rules re-checked by the worker after submit."""

from __future__ import annotations

import logging
import signal
import threading
import time

import psycopg
import pytest
from sqlalchemy import text

from spacejobs.models.db.engine import libpq_url
from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs.records import Status
from tests.conftest import submit
from tests.kinds import SECRET_MARKER
from tests.kit import broker
from tests.kit.stack import Stack, wait_until

UNREACHABLE_BROKER = "redis://127.0.0.1:1/0"


# ------------------------------------------------------------------------- fencing

def test_stalled_worker_loses_its_lease_and_its_late_finish_changes_nothing(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    client = stack.make_app().test_client()
    first = stack.start_worker(concurrency=1)

    job = submit(client, org, anna, "test.stall", {"seconds": 3})
    leased = stack.wait_for(job["id"], "leased")
    first.signal_group(signal.SIGSTOP)  # heartbeats stop with it: the lease runs out
    try:
        stack.wait_for_lease_to_run_out(job["id"])
        second = stack.start_worker(concurrency=1)
        stack.start_beat()
        done = stack.wait_for(job["id"], "completed", timeout=30)
    finally:
        first.signal_group(signal.SIGCONT)

    assert done["attempts"] == 2
    assert done["result"]["attempt"] == 2
    assert str(leased["lease_token"]) not in str(done)
    # The first attempt wakes up, finishes its sleep and tries to finish with its old token.
    first.wait_for_log("stale finish discarded", timeout=20)
    after = stack.job_row(job["id"])
    assert after["result"] == done["result"] and after["finished_at"] == done["finished_at"]
    completions = [e for e in stack.events(job["id"]) if e["to_status"] == "completed"]
    assert len(completions) == 1 and completions[0]["attempt"] == 2
    assert "stale finish discarded" not in second.output()


# ------------------------------------------------------------------------- retries

def test_failing_kind_retries_with_growing_backoff_then_fails_with_a_safe_message(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    job = submit(client, org, anna, "test.fail")
    row = stack.wait_for(job["id"], "failed", timeout=30)

    assert row["attempts"] == 3
    assert row["error_code"] == "internal_error"
    events = stack.events(job["id"])
    assert [e["to_status"] for e in events] == [
        "queued", "leased", "queued", "leased", "queued", "leased", "failed"]

    requeued = [e["at"] for e in events[1:] if e["to_status"] == "queued"]
    releases = [e["at"] for e in events[1:] if e["to_status"] == "leased"][1:]
    waits = [(leased - queued).total_seconds() for queued, leased in zip(requeued, releases, strict=True)]
    # backoff 0.4 s doubling, jittered within [half, full]: ≥0.2 s then ≥0.4 s
    assert waits[0] >= 0.19 and waits[1] >= 0.39, waits

    answer = client.get(f"/api/v1/orgs/{org}/jobs/{job['id']}", headers=anna.auth)
    error = answer.get_json()["error"]
    assert error == {"code": "internal_error", "message": "The job failed because of an internal error."}
    body = answer.get_data(as_text=True)
    for leak in ("SECRET-7f3a", "hunter2", "postgresql://", "Traceback", "RuntimeError"):
        assert leak not in body

    # The detail exists, for operators only: what failed and where, never what it said.
    with transaction(stack.operator_db) as conn:
        diagnostics = conn.execute(
            text("SELECT attempt, exception_class, traceback FROM job_diagnostics"
                 " WHERE job_id = :id ORDER BY attempt"), {"id": job["id"]}).all()
    assert [d.attempt for d in diagnostics] == [1, 2, 3]
    assert diagnostics[0].exception_class == "builtins.RuntimeError"
    assert "tests/kinds.py" in diagnostics[0].traceback
    assert "in always_fails" in diagnostics[0].traceback
    assert "builtins.RuntimeError (message withheld)" in diagnostics[0].traceback
    assert SECRET_MARKER not in diagnostics[0].traceback and "hunter2" not in diagnostics[0].traceback


# ------------------------------------------------------------------------- broker and database

def test_broker_down_at_submit_still_accepts_and_the_sweeper_delivers(bare_stack: Stack, caplog):
    stack = bare_stack
    stack.retire(*stack.processes)
    # No lingering (LISTEN), no idle claim by the floor: only the broker's wake-ups and the
    # sweeper's may start a job here.
    worker = stack.start_worker(concurrency=1, SPACEJOBS_LINGER_SECONDS="0",
                                SPACEJOBS_FLOOR_IDLE_POLL="0")
    beat = stack.start_beat()
    lost_wakeups = stack.make_app(BROKER_URL=UNREACHABLE_BROKER).test_client()
    org = stack.org()
    anna = stack.user(org, role="owner")
    with caplog.at_level(logging.WARNING, logger="spacejobs.wakeups"):
        started = time.monotonic()
        job = submit(lost_wakeups, org, anna, "bench.noop")
        # The next submits do not even try the dead broker for a few seconds: they stay fast.
        more = [submit(lost_wakeups, org, anna, "bench.noop") for _ in range(3)]
        assert time.monotonic() - started < 5
    assert sum("wake-up not published" in r.getMessage() for r in caplog.records) == 1
    rows = [stack.wait_for(each["id"], "completed", timeout=20) for each in (job, *more)]
    # Only the sweeper could have signalled them; one re-signal drains every due job behind it.
    assert any(row["last_wakeup_at"] > row["created_at"] for row in rows)
    stack.retire(worker, beat)


def test_the_sweeper_re_signals_a_backlog_with_one_wake_up_per_claim_batch_and_it_all_runs(
        bare_stack: Stack):
    stack = bare_stack
    stack.retire(*stack.processes)
    org = stack.org()
    anna = stack.user(org, role="owner")
    lost_wakeups = stack.make_app(BROKER_URL=UNREACHABLE_BROKER).test_client()
    answer = lost_wakeups.post(f"/api/v1/orgs/{org}/jobs:batch", headers=anna.auth,
                               json={"jobs": [{"kind": "bench.noop"}] * 250})
    assert answer.status_code == 202, answer.get_json()
    broker.purge_queue(stack.redis_url, stack.queue)
    with stack.admin() as conn:
        # Ours unsignalled for an hour; any other queued job signalled just now.
        conn.execute(text("UPDATE jobs SET last_wakeup_at = CASE WHEN organization_id = :org"
                          " THEN now() - interval '1 hour' ELSE now() END WHERE status = 'queued'"),
                     {"org": org})
    # A grace of a minute: each job is re-signalled by the first sweep only.
    beat = stack.start_beat(SPACEJOBS_WAKEUP_GRACE="60")

    def still_unsignalled() -> int:
        with stack.admin() as conn:
            return conn.execute(text("SELECT count(*) FROM jobs WHERE organization_id = :org"
                                     " AND last_wakeup_at < now() - interval '30 minutes'"),
                                {"org": org}).scalar_one()

    try:
        wait_until(lambda: still_unsignalled() == 0, what="the sweep's re-signals")
        # The sweep commits its marks, then publishes: wait for the line it logs after both,
        # or retiring beat may cut its publishing short.
        beat.wait_for_log("'wakeups_sent': 3,", timeout=15)
    finally:
        stack.retire(beat)
    # 250 due jobs, claims of up to 100 (SPACEJOBS_CLAIM_BATCH): three wake-ups, not 250.
    assert queue_length(stack) == 3
    # No lingering, no idle claim, no beat: only those three messages can start the jobs, and
    # they all run.
    worker = stack.start_worker(concurrency=2, SPACEJOBS_LINGER_SECONDS="0",
                                SPACEJOBS_FLOOR_IDLE_POLL="0")
    wait_until(lambda: stack.job_counts(org)[Status.COMPLETED] == 250, timeout=30,
               what="all 250 jobs completed")
    stack.retire(worker)


def test_a_lingering_worker_starts_a_new_job_without_any_broker_message(bare_stack: Stack):
    stack = bare_stack
    stack.retire(*stack.processes)
    worker = stack.start_worker(concurrency=1, SPACEJOBS_LINGER_SECONDS="30")
    org = stack.org()
    anna = stack.user(org, role="owner")
    first = submit(stack.make_app().test_client(), org, anna, "bench.noop")
    stack.wait_for(first["id"], "completed")  # the worker drained, and now listens
    # No beat, and the web cannot reach the broker: only the insert's NOTIFY can start this one.
    job = submit(stack.make_app(BROKER_URL=UNREACHABLE_BROKER).test_client(), org, anna,
                 "bench.noop")
    done = stack.wait_for(job["id"], "completed", timeout=10)
    assert done["last_wakeup_at"] == done["created_at"]  # the sweeper never touched it
    stack.retire(worker)


def test_the_first_linger_looks_again_before_it_waits(bare_stack: Stack, monkeypatch):
    """A job committed between the claim that found the queue empty and the LISTEN that starts
    a process's first linger notified nobody. So the first wait answers at once (the runner
    claims again); from then on the LISTEN stands, and a wait ends only on a new job."""
    from spacejobs.models.settings import get_settings
    from spacejobs.tasks import worker_process

    stack = bare_stack
    monkeypatch.setattr(worker_process, "role_url", lambda role: stack.worker_url)
    monkeypatch.setattr(worker_process, "listen_url", libpq_url)
    process = worker_process.WorkerProcess(get_settings())
    org = stack.org()
    anna = stack.user(org, role="owner")
    try:
        assert process.wait_for_work(10) is True  # no job, no NOTIFY: it looks again
        assert process.wait_for_work(0.3) is False  # listening now, and nothing came
        submit(stack.make_app().test_client(), org, anna, "bench.noop")
        assert process.wait_for_work(10) is True  # the insert's NOTIFY
    finally:
        process.stop_listening()
        process.engine.dispose()


def queue_length(stack: Stack) -> int:
    return broker.queue_length(stack.redis_url, stack.queue)


def job_count(stack: Stack, org) -> int:
    return sum(stack.job_counts(org).values())


def test_database_unreachable_at_submit_is_503_with_no_row_and_no_wakeup(stack: Stack):
    org = stack.org()
    anna = stack.user(org, role="owner")
    app = stack.make_app(DATABASE_URL="postgresql://space_app@127.0.0.1:1/nowhere")
    before = queue_length(stack)
    answer = app.test_client().post(f"/api/v1/orgs/{org}/jobs", json={"kind": "bench.noop"},
                                    headers=anna.auth)
    assert answer.status_code == 503
    assert answer.get_json() == {"error": {"code": "unavailable",
                                           "message": "The service is temporarily unavailable."}}
    assert "127.0.0.1" not in answer.get_data(as_text=True)
    assert job_count(stack, org) == 0
    assert queue_length(stack) == before


def test_database_that_cannot_take_the_row_is_503_with_no_row_and_no_wakeup(stack: Stack):
    org = stack.org()
    anna = stack.user(org, role="owner")
    app = stack.make_app(DB_STATEMENT_TIMEOUT_MS=300)
    client = app.test_client()
    client.get("/api/v1/me", headers=anna.auth)  # warm the pool: the lock below blocks new logins
    before = queue_length(stack)
    locked, release = threading.Event(), threading.Event()

    def hold_lock() -> None:
        with psycopg.connect(libpq_url(stack.admin_url)) as conn:
            conn.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(10)

    holder = threading.Thread(target=hold_lock)
    holder.start()
    try:
        assert locked.wait(5)
        answer = client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": "bench.noop"}, headers=anna.auth)
    finally:
        release.set()
        holder.join()
    assert answer.status_code == 503
    assert answer.get_json()["error"]["code"] == "unavailable"
    assert job_count(stack, org) == 0
    assert queue_length(stack) == before


# ------------------------------------------------------------------------- re-checks in the worker

def test_requester_removed_after_submit_fails_and_loses_access_to_the_result(stack: Stack, client):
    org = stack.org()
    vera = stack.user(org, role="member")
    with stack.workers_paused():
        job = submit(client, org, vera, "projects_export")
        stack.remove_member(org, vera.id)
    row = stack.wait_for(job["id"], "failed", timeout=20)
    assert row["error_code"] == "requester_not_member"
    assert row["attempts"] == 1  # permanent: no retry
    assert row["result"] is None
    for path in (f"/jobs/{job['id']}/result", f"/jobs/{job['id']}"):
        assert client.get(f"/api/v1/orgs/{org}{path}", headers=vera.auth).status_code == 404


def test_read_only_org_still_exports_but_a_queued_import_fails_read_only(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    with stack.workers_paused():
        export = submit(client, org, anna, "projects_export")
        imported = submit(client, org, anna, "projects_import", {"projects": [{"name": "x"}]})
        stack.set_state(org, "read_only")

    assert stack.wait_for(export["id"], "completed", "failed")["status"] == "completed"
    row = stack.wait_for(imported["id"], "completed", "failed")
    assert (row["status"], row["error_code"]) == ("failed", "organization_read_only")
    assert row["attempts"] == 1
    projects = client.get(f"/api/v1/orgs/{org}/projects", headers=anna.auth).get_json()["projects"]
    assert projects == []


@pytest.mark.parametrize("state", ["deleting", "deleted"])
def test_unavailable_org_refuses_submit_and_fails_queued_export(stack: Stack, client, state):
    org = stack.org()
    anna = stack.user(org, role="owner")
    with stack.workers_paused():
        queued = submit(client, org, anna, "projects_export")
        stack.set_state(org, state)

    answer = client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": "projects_export"}, headers=anna.auth)
    assert answer.status_code == 409
    assert answer.get_json()["error"]["code"] == "organization_unavailable"
    row = stack.wait_for(queued["id"], "completed", "failed")
    assert (row["status"], row["error_code"]) == ("failed", "organization_unavailable")


def test_import_writes_projects_once_and_reports_them(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="admin")
    job = submit(client, org, anna, "projects_import",
                 {"projects": [{"name": "one"}, {"name": "two", "description": "2"}]})
    stack.wait_for(job["id"], "completed")
    result = client.get(f"/api/v1/orgs/{org}/jobs/{job['id']}/result", headers=anna.auth).get_json()
    assert result["result"]["imported"] == 2
    names = sorted(p["name"] for p in
                   client.get(f"/api/v1/orgs/{org}/projects", headers=anna.auth).get_json()["projects"])
    assert names == ["one", "two"]
