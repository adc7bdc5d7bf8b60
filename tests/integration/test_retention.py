"""Retention: finished jobs, results and events go by age, in bounded batches; active jobs never."""

from __future__ import annotations

import json
import time
import uuid

from sqlalchemy import text

from models.db.transaction import transaction
from models.jobs import store
from models.settings import get_settings
from models.tenancy import audit
from tests.integration.leasing import claim_one, complete_one
from tests.kit.stack import Stack

DAY = 86_400


def old_job(stack: Stack, org, user, *, status: str, days: float, result=None) -> uuid.UUID:
    """A job that finished (or was created, if active) ``days`` ago, inserted as the owner."""
    with stack.admin() as conn:
        job_id = conn.execute(text(
            "INSERT INTO jobs (organization_id, requested_by, kind, status, lease_seconds, max_attempts,"
            " attempts, result, created_at, finished_at)"
            " VALUES (:org, :user, 'bench.noop', :status, 30, 3, 1, CAST(:result AS jsonb),"
            " now() - :age * interval '1 day',"
            " CASE WHEN :status IN ('completed', 'failed', 'cancelled')"
            "      THEN now() - :age * interval '1 day' END)"
            " RETURNING id"),
            {"org": org, "user": user, "status": status, "age": days,
             "result": None if result is None else json.dumps(result)}).scalar_one()
    return job_id


def exists(stack: Stack, job_id) -> bool:
    with transaction(stack.worker_db) as conn:
        return conn.execute(text("SELECT count(*) FROM jobs WHERE id = :id"), {"id": job_id}).scalar() == 1


def purge(stack: Stack, batch: int = 1000, **ages: float) -> dict[str, int]:
    settings = {"jobs_age": 30 * DAY, "results_age": 7 * DAY, "events_age": 30 * DAY} | ages
    with transaction(stack.worker_db, actor="sweeper") as conn:
        return store.purge_finished(conn, batch=batch, **settings)


def test_old_finished_jobs_go_with_their_events_and_active_jobs_stay(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    user = stack.user(org)
    gone = [old_job(stack, org, user.id, status=s, days=40) for s in ("completed", "failed", "cancelled")]
    kept_recent = old_job(stack, org, user.id, status="completed", days=2)
    kept_active = old_job(stack, org, user.id, status="queued", days=400)

    assert all(stack.events(j) for j in gone)
    assert purge(stack)["jobs_deleted"] == 3
    assert not any(exists(stack, j) for j in gone)
    assert not any(stack.events(j) for j in gone)  # no foreign key: a trigger takes them along
    assert exists(stack, kept_recent) and exists(stack, kept_active)
    assert stack.events(kept_recent) and stack.events(kept_active)
    assert purge(stack)["jobs_deleted"] == 0


def test_a_deleted_organization_leaves_no_event_behind(bare_stack: Stack):
    """Organizations cascade to their jobs; the jobs' events follow by trigger (revision 0015)."""
    stack = bare_stack
    org, other = stack.org(), stack.org()
    jobs = [old_job(stack, org, stack.user(org).id, status="completed", days=1) for _ in range(3)]
    kept = old_job(stack, other, stack.user(other).id, status="queued", days=0)
    with stack.admin() as conn:
        conn.execute(text("DELETE FROM organizations WHERE id = :org"), {"org": org})
        orphans = conn.execute(text(
            "SELECT count(*) FROM job_events e WHERE NOT EXISTS"
            " (SELECT 1 FROM jobs j WHERE j.id = e.job_id)")).scalar_one()
    assert orphans == 0
    assert not any(stack.events(j) for j in jobs)
    assert stack.events(kept)


def test_truncating_jobs_truncates_their_events(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    old_job(stack, org, stack.user(org).id, status="queued", days=0)
    with stack.admin() as conn:
        conn.execute(text("TRUNCATE jobs CASCADE"))
        assert conn.execute(text("SELECT count(*) FROM job_events")).scalar_one() == 0


def test_purge_is_bounded_per_call(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    user = stack.user(org)
    for _ in range(5):
        old_job(stack, org, user.id, status="completed", days=60)
    assert purge(stack, batch=2)["jobs_deleted"] == 2
    assert purge(stack, batch=2)["jobs_deleted"] == 2
    assert purge(stack, batch=2)["jobs_deleted"] == 1


def test_expired_result_is_dropped_and_the_api_says_410(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    job_id = old_job(stack, org, anna.id, status="completed", days=8, result={"projects": ["x"]})
    client = stack.make_app().test_client()
    assert client.get(f"/api/v1/orgs/{org}/jobs/{job_id}/result", headers=anna.auth).status_code == 200

    assert purge(stack)["results_dropped"] == 1
    row = stack.job_row(job_id)
    assert row["result"] is None and row["result_expired_at"] is not None
    assert row["status"] == "completed" and row["finished_at"] is not None
    answer = client.get(f"/api/v1/orgs/{org}/jobs/{job_id}/result", headers=anna.auth)
    assert answer.status_code == 410 and answer.get_json()["error"]["code"] == "result_expired"
    assert client.get(f"/api/v1/orgs/{org}/jobs/{job_id}", headers=anna.auth).status_code == 200


def test_events_of_old_finished_jobs_go_but_the_job_row_stays(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    client = stack.make_app(BROKER_URL="redis://127.0.0.1:1/0").test_client()
    job_id = client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": "bench.noop"},
                         headers=anna.auth).get_json()["id"]
    with transaction(stack.worker_db) as conn:
        leased = claim_one(conn, "w")
        while leased is not None and str(leased.id) != job_id:
            complete_one(conn, leased.id, leased.lease_token, {})
            leased = claim_one(conn, "w")
        complete_one(conn, leased.id, leased.lease_token, {})
    assert len(stack.events(job_id)) == 3
    assert purge(stack, events_age=0)["events_deleted"] >= 3
    assert stack.events(job_id) == [] and exists(stack, job_id)


def test_old_audit_entries_go_by_age_through_the_owners_purge(bare_stack: Stack):
    """The worker may not delete an entry itself (tests/integration/test_least_privilege.py);
    purge_org_audit() does, as the owner, past SPACEJOBS_KEEP_AUDIT_DAYS (365 by default)."""
    stack = bare_stack
    org = stack.org()
    stack.user(org)  # a fresh 'member.add' entry, which stays
    with stack.admin() as conn:
        conn.execute(text(
            "INSERT INTO org_audit (organization_id, actor, action, detail, at)"
            " SELECT :org, 'cli', 'organization.state_change', '{}', now() - d * interval '1 day'"
            " FROM unnest(ARRAY[400, 380, 366, 300]) AS d"), {"org": org})

    def ages() -> list[int]:
        with stack.admin() as conn:
            return list(conn.execute(text(
                "SELECT extract(day FROM now() - at)::int FROM org_audit"
                " WHERE organization_id = :org ORDER BY at"), {"org": org}).scalars())

    age = get_settings().keep_audit_days * DAY
    assert age == 365 * DAY
    with transaction(stack.worker_db, actor="sweeper") as conn:
        assert audit.purge(conn, age=age, batch=2) == 2
    with transaction(stack.worker_db, actor="sweeper") as conn:
        assert audit.purge(conn, age=age, batch=2) == 1
        assert audit.purge(conn, age=age, batch=2) == 0
    assert ages() == [300, 0]


def test_beats_sweep_purges_old_audit_entries(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    with stack.admin() as conn:
        conn.execute(text("INSERT INTO org_audit (organization_id, actor, action, at)"
                          " VALUES (:org, 'cli', 'member.remove', now() - interval '2 days')"),
                     {"org": org})

    def left() -> int:
        with stack.admin() as conn:
            return conn.execute(text("SELECT count(*) FROM org_audit WHERE organization_id = :org"),
                                {"org": org}).scalar_one()

    beat = stack.start_beat(SPACEJOBS_KEEP_AUDIT_DAYS="1")
    try:
        deadline = time.monotonic() + 30
        while left() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert left() == 0
        # The sweep commits, then logs its counts: wait for the line rather than race it.
        beat.wait_for_log("'audit_deleted': ", timeout=15)
    finally:
        stack.retire(beat)
    assert "sweep failed" not in beat.output()
