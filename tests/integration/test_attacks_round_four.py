"""Least privilege, round four: the review's attacks on workflows, signals, steps and counters,
each tried as the attacker would, as the real application roles (space_app through the web or
its engine, space_worker through its engine; never a superuser). Each test failed on the code
before its fix (docs/security.md says how it was seen to) and must be refused now.

One stack with a worker and beat: the tests that count active jobs freeze the workers while
they count (``stack.workers_paused()``), so nothing ends under them.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from spacejobs.models.db.transaction import transaction
from spacejobs.models.errors import InsufficientRole
from spacejobs.models.jobs import store
from spacejobs.models.jobs.canvas import chain, sig
from spacejobs.models.ops import quota_policy
from spacejobs.models.tenancy import accounts
from tests.kit import facts
from tests.kit.seeding import TestUser
from tests.kit.stack import Stack
from tests.kit.waiting import wait_until


@pytest.fixture(scope="module")
def client(stack: Stack) -> Any:
    return stack.make_app().test_client()


def workflow_body(*kinds: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"kind": "workflow", "params": {"steps": [
        {"name": f"step {place}", "kind": kind, "params": params or {}}
        for place, kind in enumerate(kinds)]}}


def post_job(client: Any, org: uuid.UUID, user: TestUser, body: dict[str, Any]) -> Any:
    return client.post(f"/api/v1/orgs/{org}/jobs", json=body, headers=user.auth)


def set_quota(stack: Stack, org: uuid.UUID, limit: int | None, kind: str | None = None) -> None:
    with stack.admin() as conn:
        accounts.set_quota(conn, org, limit, kind)


def counted_active(stack: Stack, org: uuid.UUID) -> int:
    """What admission counts for the organization: its active jobs and the children its
    parents reserved (active_job_counts, as the owner)."""
    with stack.admin() as conn:
        return conn.execute(text("SELECT coalesce(sum(active), 0) FROM active_job_counts"
                                 " WHERE organization_id = :o"), {"o": org}).scalar_one()


def jobs_of(stack: Stack, org: uuid.UUID) -> list[dict[str, Any]]:
    with stack.admin() as conn:
        return [dict(row) for row in conn.execute(text(
            "SELECT id, kind, status, parent_id, octet_length(params::text) AS params_bytes"
            " FROM jobs WHERE organization_id = :o ORDER BY created_at"), {"o": org}).mappings()]


# ------------------------------------------------------------- 1. a workflow escapes the quota

def test_a_batch_of_workflows_cannot_take_an_organization_past_its_cap(stack: Stack, client):
    """Attack: with a cap of 10, one batch of 10 workflows x 100 steps (the review left 1,010
    active jobs); then one workflow of 100 steps."""
    org = stack.org()
    anna = stack.user(org, role="owner")
    set_quota(stack, org, 10)
    with stack.workers_paused():
        batch = client.post(f"/api/v1/orgs/{org}/jobs:batch", headers=anna.auth,
                            json={"jobs": [workflow_body(*["bench.noop"] * 100)] * 10})
        assert batch.status_code == 429, batch.get_json()
        assert batch.get_json()["error"]["code"] == "too_many_jobs"
        single = post_job(client, org, anna, workflow_body(*["bench.noop"] * 100))
        assert single.status_code == 429
        assert jobs_of(stack, org) == [] and counted_active(stack, org) == 0
        # A workflow counts as itself and its steps from its submit: 6 of the 10.
        assert post_job(client, org, anna, workflow_body(*["bench.noop"] * 5)).status_code == 202
        assert counted_active(stack, org) == 6
        with stack.admin() as conn:  # one queued job and five reserved steps, counted exactly
            assert facts.active_counts_off(conn) == 0
        answers = [post_job(client, org, anna, {"kind": "bench.noop"}).status_code
                   for _ in range(5)]
        assert answers == [202, 202, 202, 202, 429]
        assert counted_active(stack, org) == 10
    # As the steps are made and end, the count follows them down to nothing.
    wait_until(lambda: counted_active(stack, org) == 0, 60, what="every job of the org ended")
    assert {job["status"] for job in jobs_of(stack, org)} == {"completed"}
    assert len(jobs_of(stack, org)) == 1 + 5 + 4


def test_a_workflow_cannot_take_a_kind_past_its_own_cap(stack: Stack, client):
    """Attack: three steps of test.capped (a kind capped at 2) in one workflow."""
    org = stack.org()
    anna = stack.user(org, role="owner")
    with stack.workers_paused():
        refused = post_job(client, org, anna, workflow_body("test.capped", "test.capped",
                                                            "test.capped"))
        assert refused.status_code == 429
        assert "test.capped" in refused.get_json()["error"]["message"]
        assert jobs_of(stack, org) == []


def test_a_kinds_own_fan_out_past_the_cap_fails_its_attempt_and_makes_nothing(stack: Stack):
    """Attack: a kind's ctx.fan_out of 8 children in an organization capped at 5 (the review:
    children were made straight into jobs, never admitted)."""
    org = stack.org()
    anna = stack.user(org, role="owner")
    set_quota(stack, org, 5)
    with stack.app_db.begin() as conn:
        parent = stack.jobs.submit(conn, "test.fan", {"parts": [{"n": n} for n in range(8)]},
                                   organization_id=org, requested_by=anna.id).job
    refused = stack.wait_for(parent.id, "queued", "failed", timeout=30)
    wait_until(lambda: stack.job_row(parent.id)["error_code"] == "too_many_jobs", 30,
               what="the parent's attempt refused by the cap")
    assert [job for job in jobs_of(stack, org) if job["parent_id"]] == []
    assert refused["status"] in ("queued", "leased")  # a retryable refusal: it tries again
    set_quota(stack, org, 100)
    done = stack.wait_for(parent.id, "completed", timeout=60)
    assert [part["n"] for part in done["result"]["parts"]] == list(range(8))
    assert counted_active(stack, org) == 0


# --------------------------------------------------- 2. step inputs grow with the square of steps

def test_a_chain_of_large_results_keeps_each_steps_row_small(stack: Stack):
    """Attack: a chain of 12 steps of 64 KiB results (the review's 40 x 53 KiB wrote 40.8 MiB of
    params). Each step still reads its input: the previous step's whole result."""
    org = stack.org()
    anna = stack.user(org, role="owner")
    with stack.app_db.begin() as conn:
        workflow = stack.jobs.submit_workflow(conn, chain(*[sig("test.blob", kib=64)] * 12),
                                              organization_id=org, requested_by=anna.id).job
    outcome = stack.jobs.wait(workflow.id, 120, organization_id=org)
    assert outcome.job.status == "completed", outcome.job.error_message
    steps = [job for job in jobs_of(stack, org) if job["parent_id"] == workflow.id]
    assert len(steps) == 12
    assert max(step["params_bytes"] for step in steps) < 100  # {"kib": 64, "_after": [n]}
    with stack.admin() as conn:  # each step's own result, in place order
        reads = conn.execute(text(
            "SELECT (result ->> 'read')::integer FROM jobs WHERE parent_id = :w"
            " ORDER BY child_index"), {"w": workflow.id}).scalars().all()
    assert reads == [0] + [64 * 1024] * 11


# -------------------------------------------------------------------- 3. signals are unbounded

def waiting_approval(stack: Stack, org: uuid.UUID, user: TestUser) -> uuid.UUID:
    with stack.app_db.begin() as conn:
        job = stack.jobs.submit(conn, "test.approval", {"timeout": 300}, organization_id=org,
                                requested_by=user.id).job
    stack.wait_for(job.id, "waiting")
    return job.id


def signal(client: Any, org: uuid.UUID, user: TestUser, job: uuid.UUID, name: str,
           payload: Any) -> Any:
    return client.post(f"/api/v1/orgs/{org}/jobs/{job}/signals/{name}", json=payload,
                       headers=user.auth)


def signals_kept(stack: Stack, job: uuid.UUID) -> list[dict[str, Any]]:
    with stack.admin() as conn:
        return [dict(row) for row in conn.execute(text(
            "SELECT name, payload, sent_by, sender_role, taken_at FROM job_signals"
            " WHERE job_id = :j ORDER BY id"), {"j": job}).mappings()]


def test_a_job_holds_at_most_ten_signals_it_has_not_taken(stack: Stack, client):
    """Attack: the requester sends signal after signal to a name nobody waits for (the review
    stored 1,000 x 64 KiB on one job)."""
    org = stack.org()
    anna = stack.user(org, role="owner")
    job = waiting_approval(stack, org, anna)
    payload = {"filler": "x" * 1000}
    answers = [signal(client, org, anna, job, "nobody-waits", payload).status_code
               for _ in range(11)]
    assert answers == [202] * 10 + [409]
    refused = signal(client, org, anna, job, "nobody-waits", payload).get_json()["error"]
    assert refused["code"] == "too_many_signals"
    assert len(signals_kept(stack, job)) == 10


def test_signal_job_itself_refuses_a_payload_over_64_kib(stack: Stack):
    """Attack: the web's credential calls signal_job() directly, past the web's own check."""
    org = stack.org()
    anna = stack.user(org, role="owner")
    job = waiting_approval(stack, org, anna)
    with transaction(stack.app_db, organization_id=org, user_id=anna.id) as conn:
        outcome = conn.execute(text(
            "SELECT outcome FROM signal_job(:id, 'approve', CAST(:payload AS jsonb), :user, '{}')"),
            {"id": job, "payload": json.dumps({"big": "x" * 70_000}), "user": anna.id}).scalar_one()
    assert outcome == "too_large"
    assert signals_kept(stack, job) == [] and stack.job_row(job)["status"] == "waiting"


def test_a_taken_signal_names_its_sender_whatever_its_payload_claims(stack: Stack, client):
    """Attack: a plain member approves as someone else by writing "by" into the payload. The
    kind is told who sent it, and their role, by the database."""
    org = stack.org()
    anna = stack.user(org, role="owner")
    vera = stack.user(org, role="member")
    job = waiting_approval(stack, org, anna)
    forged = {"by": str(anna.id), "role": "owner"}
    assert signal(client, org, vera, job, "approve", forged).status_code == 202
    done = stack.wait_for(job, "completed")
    assert done["result"] == {"payload": forged, "sent_by": str(vera.id), "sender_role": "member"}
    (kept,) = signals_kept(stack, job)
    # The payload lives on in the job's recorded step, not twice.
    assert (kept["sent_by"], kept["sender_role"], kept["payload"]) == (vera.id, "member", None)


def test_a_read_only_organizations_waiting_job_takes_a_signal_as_it_takes_a_cancel(
        stack: Stack, client):
    """The rule, written down: a signal follows the cancel's, which a read-only organization
    keeps; the kind's own states decide whether it goes on (test.approval may run there)."""
    org = stack.org()
    anna = stack.user(org, role="owner")
    job = waiting_approval(stack, org, anna)
    stack.set_state(org, "read_only")
    assert signal(client, org, anna, job, "approve", {"ok": True}).status_code == 202
    assert stack.wait_for(job, "completed")["result"]["sender_role"] == "owner"


# ------------------------------------ 4, 5. a parent is as hard to act on as what it holds

def test_a_plain_member_cannot_cancel_an_admins_workflow_that_holds_an_admins_step(
        stack: Stack, client):
    """Attack: the step alone answered 403, the workflow that holds it 200 (and the step was
    cancelled with her id)."""
    org = stack.org()
    anna = stack.user(org, role="admin")
    vera = stack.user(org, role="member")
    with stack.app_db.begin() as conn:
        workflow = stack.jobs.submit_workflow(
            conn, chain(sig("bench.sleep", seconds=20), sig("test.admin_step")),
            organization_id=org, requested_by=anna.id).job
    # Running: its first step leased, the admin's step waiting in the workflow's plan.
    wait_until(lambda: any(job["status"] == "leased" for job in jobs_of(stack, org)
                           if job["parent_id"] == workflow.id), 30, what="the first step running")
    refused = client.post(f"/api/v1/orgs/{org}/jobs/{workflow.id}/cancel", headers=vera.auth)
    assert refused.status_code == 403, refused.get_json()
    assert refused.get_json()["error"]["code"] == "insufficient_role"
    with pytest.raises(InsufficientRole), stack.jobs.transaction(org, vera.id) as (conn, member):
        stack.jobs.cancel(conn, member, workflow.id)
    assert {job["status"] for job in jobs_of(stack, org)} == {"waiting", "leased"}
    assert client.post(f"/api/v1/orgs/{org}/jobs/{workflow.id}/cancel",
                       headers=anna.auth).status_code == 200
    stack.wait_for(workflow.id, "cancelled")


def test_a_plain_member_cannot_read_an_admins_step_result_through_its_workflows_result(
        stack: Stack, client):
    """Attack: the step's result answered 403, the workflow's result (which carries it) 200."""
    org = stack.org()
    anna = stack.user(org, role="admin")
    vera = stack.user(org, role="member")
    with stack.app_db.begin() as conn:
        workflow = stack.jobs.submit_workflow(conn, chain(sig("test.admin_step")),
                                              organization_id=org, requested_by=anna.id).job
    assert stack.jobs.wait(workflow.id, 60, organization_id=org).job.status == "completed"
    url = f"/api/v1/orgs/{org}/jobs/{workflow.id}/result"
    refused = client.get(url, headers=vera.auth)
    assert refused.status_code == 403 and "admins only" not in refused.get_data(as_text=True)
    with pytest.raises(InsufficientRole), stack.jobs.transaction(org, vera.id) as (conn, member):
        stack.jobs.result(conn, member, workflow.id)
    allowed = client.get(url, headers=anna.auth)
    assert allowed.status_code == 200
    assert allowed.get_json()["result"]["result"] == {"for": "admins only"}


def test_a_plain_member_cannot_start_through_a_workflow_what_she_could_not_start_alone(
        stack: Stack, client):
    org = stack.org()
    vera = stack.user(org, role="member")
    refused = post_job(client, org, vera, workflow_body("bench.noop", "test.admin_step"))
    assert refused.status_code == 403
    assert refused.get_json()["error"] == {
        "code": "insufficient_role", "step": 1,
        "message": "Your role in this organization does not allow this operation."}
    assert jobs_of(stack, org) == []


# ------------------------------------------ 6. the worker role and a job's steps and signals

def test_the_worker_role_reads_and_forges_no_steps_or_signals_without_a_lease(stack: Stack,
                                                                             client):
    """Attack: as space_worker, read every organization's step results and taken signals, and
    plant a step 'signal:approve#1' so the job's next run takes a forged approval."""
    org = stack.org()
    anna = stack.user(org, role="owner")
    job = waiting_approval(stack, org, anna)  # it recorded its wait's deadline as a step
    for statement in ("SELECT result FROM job_steps", "SELECT payload FROM job_signals",
                      "INSERT INTO job_steps (job_id, name, organization_id, result)"
                      " VALUES (:job, 'signal:approve#1', :org, '{\"approved\": true}')"):
        with pytest.raises(DBAPIError, match="permission denied"), \
                transaction(stack.worker_db, organization_id=org) as conn:
            conn.execute(text(statement), {"job": job, "org": org})
    stranger = uuid.uuid4()
    with transaction(stack.worker_db) as conn:
        assert conn.execute(text("SELECT held FROM step_result(:j, :t, 'signal:approve#1:deadline')"),
                            {"j": job, "t": stranger}).scalar_one() is False
        assert conn.execute(text("SELECT record_step(:j, :t, 'signal:approve#1', '{}')"),
                            {"j": job, "t": stranger}).scalar_one() is False
        assert conn.execute(text("SELECT held FROM take_signal(:j, :t, 'approve', 'x')"),
                            {"j": job, "t": stranger}).scalar_one() is False
    with stack.admin() as conn:
        names = conn.execute(text("SELECT name FROM job_steps WHERE job_id = :j"),
                             {"j": job}).scalars().all()
    assert names == ["signal:approve#1:deadline"]


@pytest.mark.parametrize("statement", [
    "SELECT lease_token FROM jobs",
    "UPDATE jobs SET status = 'waiting', wait_until = now() + interval '1 day' WHERE id = :job",
    "INSERT INTO job_diagnostics (job_id, organization_id, attempt, exception_class, traceback)"
    " SELECT id, organization_id, 1, 'Forged', 'by the worker' FROM jobs WHERE id = :job",
])
def test_the_worker_role_needs_the_lease_token_for_what_it_does_to_a_job(stack: Stack,
                                                                        statement: str):
    """Attack: read every lease token queue-wide, park a leased job as waiting directly, or
    write operators' diagnostics for any job."""
    org = stack.org()
    anna = stack.user(org, role="owner")
    with stack.app_db.begin() as conn:
        job = stack.jobs.submit(conn, "bench.sleep", {"seconds": 3}, organization_id=org,
                                requested_by=anna.id).job
    stack.wait_for(job.id, "leased")
    with pytest.raises(DBAPIError, match="permission denied"), \
            transaction(stack.worker_db) as conn:
        conn.execute(text(statement), {"job": job.id})
    with transaction(stack.worker_db) as conn:  # a function, with a token it does not hold
        assert conn.execute(text(
            "SELECT count(*) FROM fail_job(:job, :token, true, 0, 'forged', 'forged')"),
            {"job": job.id, "token": uuid.uuid4()}).scalar_one() == 0
    assert stack.wait_for(job.id, "completed")["error_code"] is None


# -------------------------------------------------- 7. the default cap is the caller's to pass

def test_a_caller_of_submit_job_cannot_lift_the_organizations_default_cap(stack: Stack):
    """Attack: as space_app, submit_job(..., p_org_quota => 2147483647) (or NULL) past the
    cap; the security page says a caller cannot bypass the quota."""
    org = stack.org()
    anna = stack.user(org, role="owner")
    with stack.admin() as conn:
        before = quota_policy.read(conn)
        quota_policy.change(conn, 1)
    try:
        outcomes = []
        with stack.workers_paused():
            for cap in (2147483647, None):
                with transaction(stack.app_db, organization_id=org, user_id=anna.id) as conn:
                    outcomes.append(conn.execute(text(
                        "SELECT outcome FROM submit_job(p_organization_id => :org,"
                        " p_requested_by => :user, p_kind => 'bench.noop', p_params => '{}',"
                        " p_max_attempts => 1, p_lease_seconds => 30,"
                        " p_org_states => '{active}', p_role => 'member',"
                        " p_org_quota => CAST(:cap AS integer))"),
                        {"org": org, "user": anna.id, "cap": cap}).scalar_one())
            assert outcomes == ["created", "over_quota"]
    finally:
        with stack.admin() as conn:
            quota_policy.change(conn, before)


# ------------------------------------------------------------ 12. metric labels of our own

def test_a_stale_finish_is_counted_by_the_database_under_the_jobs_own_kind(stack: Stack):
    org = stack.org()
    anna = stack.user(org, role="owner")
    with stack.app_db.begin() as conn:
        job = stack.jobs.submit(conn, "bench.sleep", {"seconds": 2}, organization_id=org,
                                requested_by=anna.id).job
    stack.wait_for(job.id, "leased")

    def stale_count() -> float:
        with transaction(stack.worker_db, actor="sweeper") as conn:
            store.fold_metrics(conn)
        with transaction(stack.operator_db) as conn:
            return conn.execute(text(
                "SELECT coalesce(sum(value), 0) FROM metric_counters"
                " WHERE name = 'spacejobs_stale_finishes_fenced_total' AND kind = 'bench.sleep'")
            ).scalar_one()

    before = stale_count()
    with transaction(stack.worker_db) as conn:
        assert store.complete_batch(conn, [(job.id, uuid.uuid4(), {"forged": True}, None)]) == set()
    assert stale_count() == before + 1
    assert stack.wait_for(job.id, "completed")["result"] == {"slept": 2.0}


# ------------------------------------------------------- a debounce names both requesters

def test_a_debounce_that_replaces_another_members_job_names_them_in_the_audit(stack: Stack):
    org = stack.org()
    anna = stack.user(org, role="owner")
    vera = stack.user(org, role="member")
    body = {"dedup_key": "sync", "debounce_seconds": 60}
    with stack.app_db.begin() as conn:
        first = stack.jobs.submit(conn, "bench.noop", organization_id=org,
                                  requested_by=anna.id, **body).job
    with stack.app_db.begin() as conn:
        second = stack.jobs.submit(conn, "bench.noop", organization_id=org,
                                   requested_by=vera.id, **body)
    assert second.debounced and second.job.id == first.id
    with stack.admin() as conn:
        entry = conn.execute(text(
            "SELECT actor_id, member_id FROM org_audit WHERE job_id = :j AND action = 'job.debounce'"),
            {"j": first.id}).one()
    assert (entry.actor_id, entry.member_id) == (vera.id, anna.id)
    with stack.jobs.transaction(org, anna.id) as (conn, member):
        stack.jobs.cancel(conn, member, first.id)



# ------------------------------------------------ the access log carries no values of a URL

def test_the_web_access_log_names_routes_never_the_urls_values(stack: Stack):
    """A signal's name, ids and a path no route matched are the client's words: gunicorn's
    access log (on the web's output) says the route's template instead."""
    import requests

    org = stack.org()
    anna = stack.user(org, role="owner")
    web, url = stack.start_web(workers=1)
    try:
        marker = "ZXQ" + uuid.uuid4().hex
        job = uuid.uuid4()
        requests.post(f"{url}/api/v1/orgs/{org}/jobs/{job}/signals/{marker}", json={},
                      headers=anna.auth, timeout=10)
        requests.get(f"{url}/api/v1/orgs/{org}/{marker}-path?q={marker}", headers=anna.auth,
                     timeout=10)
        wait_until(lambda: web.output().count(' "GET -" 404 ') >= 1, 10,
                   what="the access log's lines")
        log = web.output()
        assert marker not in log and str(job) not in log
        assert '"POST /api/v1/orgs/<org>/jobs/<job_id>/signals/<name>" 404' in log
    finally:
        stack.retire(web)
