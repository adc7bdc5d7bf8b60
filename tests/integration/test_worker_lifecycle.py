"""Heartbeats, time limits, cancellation and graceful shutdown, with real worker processes."""

from __future__ import annotations

import signal
import time

import pytest
from sqlalchemy import text

from spacejobs.models.db.transaction import transaction
from tests.conftest import submit
from tests.integration.leasing import complete_one
from tests.kit.stack import Stack
from tests.kit.waiting import wait_until

pytestmark = pytest.mark.slow  # Celery workers started, signalled and stopped, test after test


@pytest.fixture()
def tenant(stack: Stack):
    org = stack.org()
    return org, stack.user(org, role="owner")


# ------------------------------------------------------------------------- heartbeats

def test_heartbeats_keep_a_job_longer_than_its_lease_on_one_attempt(stack: Stack, client, tenant):
    org, anna = tenant
    job = submit(client, org, anna, "test.stall", {"seconds": 5})  # lease is 2 s
    row = stack.wait_for(job["id"], "completed", timeout=20)
    assert row["attempts"] == 1
    assert [e["to_status"] for e in stack.events(job["id"])] == ["queued", "leased", "completed"]


def test_a_job_whose_lease_is_taken_stops_at_its_next_checkpoint_and_writes_nothing(
        stack: Stack, client, tenant):
    org, anna = tenant
    job = submit(client, org, anna, "bench.sleep", {"seconds": 8})
    stack.wait_for(job["id"], "leased")
    # A newer attempt takes the lease: expired and re-leased in one owner transaction, so that no
    # worker process sees the expired lease in between and takes it first.
    with stack.admin() as conn:
        conn.execute(text("UPDATE jobs SET lease_until = now() - interval '1 second'"
                          " WHERE id = :id"), {"id": job["id"]})
        conn.execute(text("UPDATE jobs SET lease_token = gen_random_uuid(), attempts = attempts + 1,"
                          " lease_until = now() + interval '60 seconds', leased_by = 'thief'"
                          " WHERE id = :id"), {"id": job["id"]})
    thief = stack.job_row(job["id"])
    assert thief["attempts"] == 2
    # The worker's next heartbeat (every lease/3 = 3.3 s) finds the token gone.
    wait_until(lambda: "lease lost" in "".join(p.output() for p in stack.processes), 10,
               "the worker noticing its lease was lost")
    with transaction(stack.worker_db) as conn:
        assert complete_one(conn, thief["id"], thief["lease_token"], {"by": "thief"})
    time.sleep(1)
    row = stack.job_row(job["id"])
    assert row["result"] == {"by": "thief"}
    assert [e["to_status"] for e in stack.events(job["id"])].count("completed") == 1


# ------------------------------------------------------------------------- time limits

def test_soft_time_limit_fails_the_job_with_timed_out(stack: Stack, client, tenant):
    org, anna = tenant
    job = submit(client, org, anna, "test.soft_limit")
    row = stack.wait_for(job["id"], "failed", timeout=20)
    assert (row["error_code"], row["attempts"]) == ("timed_out", 1)
    assert row["finished_at"] - row["started_at"] < __import__("datetime").timedelta(seconds=4)


def test_hard_time_limit_kills_the_work_and_the_worker_carries_on(stack: Stack, client, tenant):
    org, anna = tenant
    job = submit(client, org, anna, "test.hang")
    row = stack.wait_for(job["id"], "failed", timeout=20)
    assert (row["error_code"], row["attempts"]) == ("timed_out", 1)
    assert row["result"] is None
    # The killed pool process was replaced: the worker still runs jobs.
    after = submit(client, org, anna, "bench.noop")
    stack.wait_for(after["id"], "completed", timeout=20)


# ------------------------------------------------------------------------- cancellation

def test_cancel_queued_is_immediate(stack: Stack, client, tenant):
    org, anna = tenant
    with stack.workers_paused():
        job = submit(client, org, anna, "bench.noop")
        answer = client.post(job["links"]["cancel"], headers=anna.auth)
    assert answer.status_code == 200 and answer.get_json()["status"] == "cancelled"
    assert stack.job_row(job["id"])["attempts"] == 0
    again = client.post(job["links"]["cancel"], headers=anna.auth)
    assert again.status_code == 409 and again.get_json()["error"]["code"] == "job_finished"


def test_cancel_running_is_requested_then_honoured_at_a_checkpoint(stack: Stack, client, tenant):
    org, anna = tenant
    job = submit(client, org, anna, "bench.sleep", {"seconds": 20})
    stack.wait_for(job["id"], "leased")
    answer = client.post(job["links"]["cancel"], headers=anna.auth)
    assert answer.status_code == 202 and answer.get_json()["status"] == "cancel_requested"
    row = stack.wait_for(job["id"], "cancelled", timeout=10)  # heartbeat every 3.3 s tells it
    assert row["cancel_requested_by"] == anna.id and row["result"] is None
    events = stack.events(job["id"])
    assert [e["to_status"] for e in events] == ["queued", "leased", "cancel_requested", "cancelled"]
    assert events[2]["actor"] == f"user:{anna.id}" and events[3]["actor"].startswith("worker:")
    finished = client.post(job["links"]["cancel"], headers=anna.auth)
    assert finished.status_code == 409
    assert finished.get_json()["error"] == {"code": "job_finished", "status": "cancelled",
                                            "message": "The job has already finished."}


def test_cancel_after_completion_says_the_job_finished(stack: Stack, client, tenant):
    org, anna = tenant
    job = submit(client, org, anna, "bench.noop")
    stack.wait_for(job["id"], "completed")
    answer = client.post(job["links"]["cancel"], headers=anna.auth)
    assert answer.status_code == 409
    assert answer.get_json()["error"]["status"] == "completed"
    assert stack.job_row(job["id"])["status"] == "completed"


# ------------------------------------------------------------------------- graceful shutdown

@pytest.mark.parametrize("whole_group", [False, True], ids=["sigterm-main", "sigterm-group"])
def test_sigterm_releases_an_unfinished_job_to_another_worker_at_once(bare_stack: Stack, whole_group):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    client = stack.make_app().test_client()
    leaving = stack.start_worker(concurrency=1, SPACEJOBS_SHUTDOWN_GRACE="0.5")
    # Long enough that the 0.5 s grace surely runs out first, however loaded the machine.
    job = submit(client, org, anna, "bench.sleep", {"seconds": 6})
    stack.wait_for(job["id"], "leased")
    staying = stack.start_worker(concurrency=1)

    try:
        if whole_group:
            leaving.signal_group(signal.SIGTERM)
        else:
            leaving.popen.send_signal(signal.SIGTERM)
        assert leaving.popen.wait(timeout=20) == 0
        row = stack.wait_for(job["id"], "completed", timeout=20)
        assert row["attempts"] == 1  # the released attempt was not counted
        events = stack.events(job["id"])
        assert [e["to_status"] for e in events] == ["queued", "leased", "queued", "leased", "completed"]
        at = [e["at"] for e in events]
        # Taken again at once (its own wake-up, or the next sweep if the leaving worker swallowed
        # that message), not after its 10 s lease would have expired.
        assert (at[3] - at[2]).total_seconds() < 3.0
    finally:
        stack.retire(leaving, staying)


def test_sigterm_lets_a_short_job_finish_within_the_grace_period(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    client = stack.make_app().test_client()
    worker = stack.start_worker(concurrency=1, SPACEJOBS_SHUTDOWN_GRACE="10")
    job = submit(client, org, anna, "bench.sleep", {"seconds": 1.5})
    stack.wait_for(job["id"], "leased")
    try:
        worker.popen.send_signal(signal.SIGTERM)
        assert worker.popen.wait(timeout=20) == 0
        row = stack.job_row(job["id"])
        assert (row["status"], row["attempts"]) == ("completed", 1)
    finally:
        stack.retire(worker)


def test_sigterm_gives_back_a_job_the_floor_runs_in_a_process_no_task_reached(bare_stack: Stack):
    """No wake-up is sent: the job is claimed by a pool process's floor (its own thread), in a
    process whose main thread has run no task. SIGTERM to the whole group must not kill that
    process with the job: it is given back at the grace's end and taken again at once."""
    from spacejobs.models.db.engine import make_engine
    from spacejobs.models.jobs.service import Jobs

    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    leaving = stack.start_worker(concurrency=2, SPACEJOBS_SHUTDOWN_GRACE="2",
                                 SPACEJOBS_FLOOR_IDLE_POLL="0.5")
    web_db = make_engine(stack.app_url, pool_size=1)
    try:
        job = Jobs(web_db, wake=lambda _job_id: None).enqueue(
            "bench.sleep", {"seconds": 12}, organization_id=org, requested_by=anna.id).job
        stack.wait_for(job.id, "leased")
        leaving.signal_group(signal.SIGTERM)
        assert leaving.popen.wait(timeout=30) == 0, leaving.output()[-3000:]
        row = stack.job_row(job.id)
        # Back in the queue when the worker has gone, not leased until its 10 s lease runs out.
        assert (row["status"], row["attempts"]) == ("queued", 0), leaving.output()[-3000:]
        staying = stack.start_worker(concurrency=1, SPACEJOBS_FLOOR_IDLE_POLL="0.5")
        row = stack.wait_for(job.id, "completed", timeout=30)
        assert row["attempts"] == 1
        assert [e["to_status"] for e in stack.events(job.id)] == [
            "queued", "leased", "queued", "leased", "completed"]
        stack.retire(staying)
    finally:
        stack.retire(leaving)
        web_db.dispose()
