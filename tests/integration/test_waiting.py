"""Jobs that wait without holding a worker: timers, signals, children and recorded steps, with
real worker processes, beat (whose rounds of due timers fire them) and the HTTP API. A waiting job holds
no lease and no slot; what it waits for puts it back in the queue; the attempt is not used up;
and what came before a wait is not done again."""

from __future__ import annotations

import os
import signal as signals
import uuid

import pytest
from sqlalchemy import text

from spacejobs.models.db.transaction import transaction
from spacejobs.models.errors import InternalJobError
from spacejobs.models.jobs import store
from tests.conftest import submit
from tests.kit.stack import Stack, wait_until


@pytest.fixture(scope="module")
def beat(stack: Stack):
    proc = stack.start_beat()
    yield proc
    stack.retire(proc)


def test_a_timer_job_waits_holding_no_lease_and_completes_on_the_same_attempt(stack: Stack, beat,
                                                                               client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    job = submit(client, org, anna, "bench.wait", {"seconds": 2})
    waiting = stack.wait_for(job["id"], "waiting")
    assert (waiting["lease_token"], waiting["leased_by"], waiting["lease_until"]) == (None, None, None)
    assert waiting["wait_until"] is not None and waiting["wait_signal"] is None
    shown = client.get(f"/api/v1/orgs/{org}/jobs/{job['id']}", headers=anna.auth).get_json()
    assert shown["status"] == "waiting" and shown["waiting_for"]["until"] is not None
    done = stack.wait_for(job["id"], "completed", timeout=20)
    assert done["attempts"] == 1 and done["result"] == {"waited": 2}
    assert done["finished_at"] - waiting["wait_until"] > -__import__("datetime").timedelta(seconds=0.01)
    moves = [(e["from_status"], e["to_status"]) for e in stack.events(job["id"])]
    assert moves == [(None, "queued"), ("queued", "leased"), ("leased", "waiting"),
                     ("waiting", "queued"), ("queued", "leased"), ("leased", "completed")]


def test_a_signal_sent_while_it_waits_resumes_it_with_the_payload(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    job = submit(client, org, anna, "bench.await_signal", {"name": "approved", "timeout": 60})
    waiting = stack.wait_for(job["id"], "waiting")
    assert waiting["wait_signal"] == "approved"
    sent = client.post(f"/api/v1/orgs/{org}/jobs/{job['id']}/signals/approved",
                       json={"by": "vera", "ok": True}, headers=anna.auth)
    assert sent.status_code == 202 and sent.get_json()["status"] == "queued"
    done = stack.wait_for(job["id"], "completed")
    assert done["result"] == {"signal": "approved", "payload": {"by": "vera", "ok": True}}
    assert done["attempts"] == 1


def test_a_signal_sent_before_the_wait_is_kept_for_it(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    with stack.workers_paused():
        job = submit(client, org, anna, "bench.await_signal", {"name": "go", "timeout": 60})
        sent = client.post(f"/api/v1/orgs/{org}/jobs/{job['id']}/signals/go", json=[1, 2],
                           headers=anna.auth)
        assert sent.status_code == 202 and sent.get_json()["status"] == "queued"
    done = stack.wait_for(job["id"], "completed")
    assert done["result"]["payload"] == [1, 2]
    assert "waiting" not in [e["to_status"] for e in stack.events(job["id"])]


def test_two_signals_of_one_name_are_taken_one_per_wait_in_the_order_they_came(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    job = submit(client, org, anna, "test.two_signals", {"name": "tick"})
    stack.wait_for(job["id"], "waiting")
    for n in (1, 2):
        answer = client.post(f"/api/v1/orgs/{org}/jobs/{job['id']}/signals/tick", json=n,
                             headers=anna.auth)
        assert answer.status_code == 202
    done = stack.wait_for(job["id"], "completed")
    assert done["result"] == {"first": 1, "second": 2}
    with stack.admin() as conn:
        taken = conn.execute(text("SELECT count(*) FROM job_signals WHERE job_id = :id"
                                  " AND taken_at IS NOT NULL"), {"id": job["id"]}).scalar_one()
    assert taken == 2


def test_no_signal_by_the_timeout_fails_it_signal_timeout(stack: Stack, beat, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    job = submit(client, org, anna, "bench.await_signal", {"name": "never", "timeout": 1})
    done = stack.wait_for(job["id"], "failed", timeout=20)
    assert done["error_code"] == "signal_timeout"


def test_a_caught_timeout_is_the_waits_outcome_on_every_later_run(stack: Stack, beat, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    job = submit(client, org, anna, "test.approve_or_escalate", {"timeout": 0.5, "then_sleep": 3})
    # It timed out, took the escalation branch, and now sleeps: a late approval comes.
    wait_until(lambda: (stack.job_row(job["id"])["status"] == "waiting"
                        and stack.job_row(job["id"])["wait_signal"] is None), 20,
               "the job asleep after its wait timed out")
    late = client.post(f"/api/v1/orgs/{org}/jobs/{job['id']}/signals/approve", json=True,
                       headers=anna.auth)
    assert late.status_code == 202
    done = stack.wait_for(job["id"], "completed", timeout=30)
    assert done["result"] == {"branch": "escalated"}
    with stack.admin() as conn:
        untaken = conn.execute(text("SELECT count(*) FROM job_signals WHERE job_id = :id"
                                    " AND taken_at IS NULL"), {"id": job["id"]}).scalar_one()
    assert untaken == 1  # the late signal changed nothing that had happened


def test_another_organizations_job_cannot_be_signalled_and_learns_nothing(stack: Stack, client):
    org, other = stack.org(), stack.org()
    anna = stack.user(org, role="owner")
    stranger = stack.user(other, role="owner")
    job = submit(client, org, anna, "bench.await_signal", {"name": "x", "timeout": 60})
    stack.wait_for(job["id"], "waiting")
    theirs = client.post(f"/api/v1/orgs/{other}/jobs/{job['id']}/signals/x", json={},
                         headers=stranger.auth)
    unknown = client.post(f"/api/v1/orgs/{other}/jobs/{uuid.uuid4()}/signals/x", json={},
                          headers=stranger.auth)
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.get_data() == unknown.get_data()
    with stack.admin() as conn:
        assert conn.execute(text("SELECT count(*) FROM job_signals WHERE job_id = :id"),
                            {"id": job["id"]}).scalar_one() == 0
    assert stack.job_row(job["id"])["status"] == "waiting"
    client.post(f"/api/v1/orgs/{org}/jobs/{job['id']}/cancel", headers=anna.auth)


def test_only_who_may_cancel_may_signal_and_a_finished_job_is_a_409(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    vera = stack.user(org, role="member")
    job = submit(client, org, anna, "bench.await_signal", {"name": "x", "timeout": 60})
    stack.wait_for(job["id"], "waiting")
    # bench kinds need a member; vera is one but did not start it, and holds only "member":
    # the kind's role is "member", so she may (the cancel rule). An admin-only kind would not.
    refused = client.post(f"/api/v1/orgs/{org}/jobs/{job['id']}/signals/BAD%20NAME", json={},
                          headers=vera.auth)
    assert refused.status_code in (400, 404)
    assert client.post(f"/api/v1/orgs/{org}/jobs/{job['id']}/signals/x", data=b"{not json",
                       headers={**vera.auth, "Content-Type": "application/json"}).status_code == 400
    too_big = client.post(f"/api/v1/orgs/{org}/jobs/{job['id']}/signals/x",
                          json={"blob": "x" * (64 * 1024)}, headers=vera.auth)
    assert too_big.status_code in (400, 413)
    assert client.post(f"/api/v1/orgs/{org}/jobs/{job['id']}/signals/x", json="ok",
                       headers=vera.auth).status_code == 202
    stack.wait_for(job["id"], "completed")
    again = client.post(f"/api/v1/orgs/{org}/jobs/{job['id']}/signals/x", json="late",
                        headers=anna.auth)
    assert again.status_code == 409 and again.get_json()["error"]["code"] == "job_finished"


def test_a_waiting_job_is_cancelled_at_once(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    job = submit(client, org, anna, "bench.wait", {"seconds": 600})
    stack.wait_for(job["id"], "waiting")
    answer = client.post(f"/api/v1/orgs/{org}/jobs/{job['id']}/cancel", headers=anna.auth)
    assert answer.status_code == 200 and answer.get_json()["status"] == "cancelled"
    row = stack.job_row(job["id"])
    assert row["status"] == "cancelled" and row["wait_until"] is None


def test_a_stale_attempt_cannot_move_a_waiting_job(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    job = submit(client, org, anna, "bench.wait", {"seconds": 600})
    stack.wait_for(job["id"], "waiting")
    # An attempt that lost its lease holds a token the row no longer has (a waiting row has none).
    old_token = uuid.uuid4()
    with transaction(stack.worker_db) as conn:
        assert store.wait_job(conn, uuid.UUID(job["id"]), old_token, until=None, signal="x",
                              children=None) is None
        assert not store.lock_lease(conn, uuid.UUID(job["id"]), old_token)
        assert store.fail_attempt(conn, uuid.UUID(job["id"]), old_token, InternalJobError(),
                                  retry_in=0) is None
    row = stack.job_row(job["id"])
    assert row["status"] == "waiting" and row["wait_signal"] is None
    client.post(f"/api/v1/orgs/{org}/jobs/{job['id']}/cancel", headers=anna.auth)


def test_a_step_is_not_done_again_when_the_job_resumes_after_a_wait(stack: Stack, beat, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    name = f"made-once-{uuid.uuid4().hex[:6]}"
    job = submit(client, org, anna, "test.step_then_sleep", {"project": name, "seconds": 1})
    done = stack.wait_for(job["id"], "completed", timeout=20)
    with stack.admin() as conn:
        made = conn.execute(text("SELECT id FROM projects WHERE organization_id = :org AND name = :n"),
                            {"org": org, "n": name}).scalars().all()
        steps = conn.execute(text("SELECT name FROM job_steps WHERE job_id = :id ORDER BY name"),
                             {"id": job["id"]}).scalars().all()
    assert [str(p) for p in made] == [done["result"]["project_id"]]  # one project, not two
    assert steps == ["after the sleep", "create project", "sleep#1"]
    assert done["attempts"] == 1


def test_a_step_killed_half_way_runs_again_and_the_step_before_it_does_not(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    client = stack.make_app().test_client()
    first = stack.start_worker(concurrency=1)
    beat = stack.start_beat()
    try:
        name = f"made-once-{uuid.uuid4().hex[:6]}"
        job = submit(client, org, anna, "test.killed_mid_step", {"project": name, "seconds": 60})
        wait_until(lambda: recorded_steps(stack, job["id"]) == ["one"], timeout=30,
                   interval=0.05, what="step one recorded")
        stack.retire(first)  # SIGKILL to the worker's group: step two dies before its record
        stack.start_worker(concurrency=1)
        done = stack.wait_for(job["id"], "completed", timeout=60)
    finally:
        stack.retire(beat)
    with stack.admin() as conn:
        made = conn.execute(text("SELECT id FROM projects WHERE organization_id = :org AND name = :n"),
                            {"org": org, "n": name}).scalars().all()
    assert [str(p) for p in made] == [done["result"]["project_id"]]  # step one: once, not twice
    assert done["result"]["two_ran_in_attempt"] == 2  # step two: run again, recorded once
    assert recorded_steps(stack, job["id"]) == ["one", "two"]
    assert done["attempts"] == 2  # the kill cost the attempt it happened in


def recorded_steps(stack: Stack, job_id: str) -> list[str]:
    with stack.admin() as conn:
        return list(conn.execute(text("SELECT name FROM job_steps WHERE job_id = :id ORDER BY name"),
                                 {"id": job_id}).scalars())


def test_a_timer_job_survives_its_worker_killed_while_it_waits(stack: Stack, beat, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    mine = stack.start_worker(concurrency=1)
    try:
        with stack.workers_paused():
            pass
        job = submit(client, org, anna, "bench.wait", {"seconds": 3})
        stack.wait_for(job["id"], "waiting")
        os.kill(mine.pid, signals.SIGKILL)
    finally:
        stack.retire(mine)
    done = stack.wait_for(job["id"], "completed", timeout=30)
    assert done["attempts"] == 1


def test_more_fan_out_parents_than_slots_all_finish(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    client = stack.make_app().test_client()
    for n in range(3):
        assert client.post(f"/api/v1/orgs/{org}/projects", json={"name": f"p{n}"},
                           headers=anna.auth).status_code == 201
    worker = stack.start_worker(concurrency=2)
    beat = stack.start_beat()
    try:
        parents = [submit(client, org, anna, "projects_report", {"max_parallel": 2})
                   for _ in range(4)]
        for parent in parents:
            done = stack.wait_for(parent["id"], "completed", timeout=60)
            assert len(done["result"]["projects"]) == 3
            assert done["attempts"] == 1
        waited = [e for p in parents for e in stack.events(p["id"]) if e["to_status"] == "waiting"]
        assert waited  # the parents gave their slots back while their children ran
    finally:
        stack.retire(worker, beat)


def test_a_waiting_job_is_still_active_for_its_dedup_key(stack: Stack, client):
    """A job that waits has not ended: a second submit with its dedup_key is the duplicate it
    would be while queued (the active dedup index covers waiting)."""
    org = stack.org()
    anna = stack.user(org, role="owner")
    body = {"kind": "bench.wait", "params": {"seconds": 600}, "dedup_key": "nightly"}
    first = client.post(f"/api/v1/orgs/{org}/jobs", json=body, headers=anna.auth).get_json()
    stack.wait_for(first["id"], "waiting")
    again = client.post(f"/api/v1/orgs/{org}/jobs", json=body, headers=anna.auth)
    assert again.status_code == 409 and again.get_json()["error"]["code"] == "duplicate_job"
    assert stack.count_jobs(org) == 1
    client.post(f"/api/v1/orgs/{org}/jobs/{first['id']}/cancel", headers=anna.auth)


def test_a_waiting_job_counts_against_its_organizations_quota(stack: Stack, client):
    from spacejobs.models.db.transaction import owner_transaction
    from spacejobs.models.tenancy import accounts

    org = stack.org()
    anna = stack.user(org, role="owner")
    with owner_transaction(stack.admin_db) as conn:
        accounts.set_quota(conn, org, 1)
    first = submit(client, org, anna, "bench.wait", {"seconds": 600})
    stack.wait_for(first["id"], "waiting")
    over = client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": "bench.noop"}, headers=anna.auth)
    assert over.status_code == 429 and over.get_json()["error"]["code"] == "too_many_jobs"
    client.post(f"/api/v1/orgs/{org}/jobs/{first['id']}/cancel", headers=anna.auth)
    assert submit(client, org, anna, "bench.noop")["status"] == "queued"  # cancelled: room again
