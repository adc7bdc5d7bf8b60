"""Retention: finished jobs, results and events go by age, in bounded batches; active jobs never.

The ages are the database's policy (retention_policy, models/ops/retention.py). The worker role
that runs the purge chooses only a batch size: the attacks at the end of this module call the
purge functions as space_worker with every argument they take, and nothing younger than the
policy's ages goes.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.ops import retention
from spacejobs.models.tenancy import audit
from tests.integration.leasing import claim_one, complete_one
from tests.integration.maintenance_kit import drain_queue
from tests.kit.stack import Stack


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


DEFAULT_POLICY = retention.RetentionPolicy(jobs_days=30, results_days=7, events_days=30,
                                           audit_days=365)


@pytest.fixture(autouse=True)
def default_policy(bare_stack: Stack) -> Iterator[None]:
    """Each test starts from, and leaves, the policy a new database has."""
    yield
    bare_stack.set_retention(**vars(DEFAULT_POLICY))


def purge(stack: Stack, batch: int = 1000) -> dict[str, int]:
    """The retention chore's purge, as the worker role (the chore itself:
    tests/integration/test_maintenance_retention.py)."""
    with transaction(stack.worker_db, actor="sweeper") as conn:
        return store.purge_finished(conn, batch=batch)


def test_a_new_database_keeps_the_documented_ages(bare_stack: Stack):
    with bare_stack.admin() as conn:
        assert retention.read(conn) == DEFAULT_POLICY


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


def test_events_of_old_finished_jobs_go_but_the_job_row_stays_with_what_it_holds(
        bare_stack: Stack):
    """The stored events go; what the row holds of its history stays as long as the row does:
    its birth, and the lease and completion of a job a worker ran once (revision 0061). Run
    under an actor that names no worker, a job's lease and completion are stored events, and
    go."""
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    client = stack.make_app(BROKER_URL="redis://127.0.0.1:1/0").test_client()
    ran = {}
    for actor in (None, "worker:w"):
        drain_queue(stack)
        job_id = client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": "bench.noop"},
                             headers=anna.auth).get_json()["id"]
        with transaction(stack.worker_db, actor=actor) as conn:
            leased = claim_one(conn, "w")
            assert leased is not None and str(leased.id) == job_id
            assert complete_one(conn, leased.id, leased.lease_token, {})
        assert [e["to_status"] for e in stack.events(job_id)] == ["queued", "leased", "completed"]
        ran[actor] = job_id
    stack.set_retention(events_days=1e-7)  # 9 ms
    time.sleep(0.05)
    assert purge(stack)["events_deleted"] >= 2
    assert [(e["from_status"], e["to_status"]) for e in stack.events(ran[None])] == [
        (None, "queued")]
    assert [(e["from_status"], e["to_status"]) for e in stack.events(ran["worker:w"])] == [
        (None, "queued"), ("queued", "leased"), ("leased", "completed")]
    assert exists(stack, ran[None]) and exists(stack, ran["worker:w"])


def test_old_audit_entries_go_by_age_through_the_owners_purge(bare_stack: Stack):
    """The worker may not delete an entry itself (tests/integration/test_least_privilege.py);
    purge_org_audit() does, as the owner, past the policy's audit age (365 days by default)."""
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

    with transaction(stack.worker_db, actor="sweeper") as conn:
        assert audit.purge(conn, batch=2) == 2
    with transaction(stack.worker_db, actor="sweeper") as conn:
        assert audit.purge(conn, batch=2) == 1
        assert audit.purge(conn, batch=2) == 0
    assert ages() == [300, 0]


def test_the_audit_purge_reaches_every_organizations_old_entries_a_batch_at_a_time(
        bare_stack: Stack):
    """Retention walks each organization's log by its key (organization, at, id): old entries
    of every organization go, at most a batch a call, and the young ones of each stay."""
    stack = bare_stack
    orgs = [stack.org() for _ in range(3)]
    with stack.admin() as conn:
        for org in orgs:
            conn.execute(text(
                "INSERT INTO org_audit (organization_id, actor, action, detail, at)"
                " SELECT :org, 'cli', 'organization.state_change', '{}', now() - d * interval '1 day'"
                " FROM unnest(ARRAY[500, 400, 10]) AS d"), {"org": org})

    def old_left() -> int:
        with stack.admin() as conn:
            return conn.execute(text(
                "SELECT count(*) FROM org_audit WHERE organization_id = ANY(:orgs)"
                " AND at < now() - interval '365 days'"), {"orgs": orgs}).scalar_one()

    with transaction(stack.worker_db, actor="sweeper") as conn:
        assert audit.purge(conn, batch=4) == 4
    assert old_left() == 2
    with transaction(stack.worker_db, actor="sweeper") as conn:
        assert audit.purge(conn, batch=4) == 2
        assert audit.purge(conn, batch=4) == 0
    with stack.admin() as conn:
        young = conn.execute(text(
            "SELECT organization_id, count(*) FROM org_audit WHERE organization_id = ANY(:orgs)"
            " AND action = 'organization.state_change' GROUP BY 1"), {"orgs": orgs}).all()
    assert sorted(n for _, n in young) == [1, 1, 1]


# ------------------------------------------------------------------------- the worker cannot aim it

def audit_entries(stack: Stack) -> int:
    with stack.admin() as conn:
        return conn.execute(text("SELECT count(*) FROM org_audit")).scalar_one()


def history(stack: Stack, job_id: uuid.UUID) -> tuple:
    """What retention would take of a job: its row, its result, its events."""
    return (exists(stack, job_id) and stack.job_row(job_id)["result"], len(stack.events(job_id)))


def as_worker(stack: Stack, sql: str) -> None:
    with transaction(stack.worker_db, actor="attacker") as conn:
        conn.execute(text(sql))


@pytest.mark.parametrize("call", [
    # the ages the function took from its caller before revision 0025
    "SELECT purge_org_audit(interval '0', 1000000)",
    "SELECT purge_org_audit(interval '-1 year', 2147483647)",
])
def test_the_worker_cannot_give_the_audit_purge_an_age(bare_stack: Stack, call: str):
    """Attack: as space_worker, purge_org_audit(interval '0', 1000000) deleted every entry of
    every organization, minutes old."""
    stack = bare_stack
    stack.user(stack.org())  # a fresh 'member.add' entry
    before = audit_entries(stack)
    with pytest.raises(DBAPIError) as refused:
        as_worker(stack, call)
    assert "function purge_org_audit(interval, integer) does not exist" in str(refused.value.orig)
    assert audit_entries(stack) == before > 0


@pytest.mark.parametrize("batch", [-1, 0, 1, 1000000, 2147483647])
def test_the_audit_purge_takes_nothing_younger_than_the_policy_whatever_the_batch(
        bare_stack: Stack, batch: int):
    stack = bare_stack
    org = stack.org()
    stack.user(org)
    with stack.admin() as conn:
        conn.execute(text("INSERT INTO org_audit (organization_id, actor, action, at)"
                          " VALUES (:org, 'cli', 'member.remove', now() - interval '364 days')"),
                     {"org": org})
    before = audit_entries(stack)
    with transaction(stack.worker_db, actor="attacker") as conn:
        assert audit.purge(conn, batch=batch) == 0
    assert audit_entries(stack) == before


@pytest.mark.parametrize("call", [
    "SELECT * FROM purge_finished_jobs(interval '0', interval '0', interval '0', 1000000)",
    "SELECT * FROM purge_finished_jobs('-1 year', '-1 year', '-1 year', 2147483647)",
])
def test_the_worker_cannot_give_the_history_purge_an_age(bare_stack: Stack, call: str):
    """Attack: as space_worker, purge_finished_jobs(interval '0', interval '0', interval '0',
    1000000) deleted every finished job, minutes old, with its events, diagnostics and result."""
    stack = bare_stack
    org = stack.org()
    user = stack.user(org)
    fresh = old_job(stack, org, user.id, status="completed", days=0.001, result={"kept": True})
    before = history(stack, fresh)
    assert before == ({"kept": True}, 2)  # its birth and the planted finish
    with pytest.raises(DBAPIError) as refused:
        as_worker(stack, call)
    assert "function purge_finished_jobs(" in str(refused.value.orig)
    assert "does not exist" in str(refused.value.orig)
    assert history(stack, fresh) == before


@pytest.mark.parametrize("batch", [-1, 0, 1, 1000000, 2147483647])
def test_the_history_purge_takes_nothing_younger_than_the_policy_whatever_the_batch(
        bare_stack: Stack, batch: int):
    stack = bare_stack
    org = stack.org()
    user = stack.user(org)
    stack.set_retention(jobs_days=2, results_days=2, events_days=2)
    young = [old_job(stack, org, user.id, status=s, days=1.9, result={"kept": True})
             for s in ("completed", "failed", "cancelled")]
    before = [history(stack, j) for j in young]
    purge(stack, batch=batch)
    assert [history(stack, j) for j in young] == before


def test_what_is_past_the_policy_still_goes_in_capped_batches(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    user = stack.user(org)
    stack.set_retention(jobs_days=2)
    old = [old_job(stack, org, user.id, status="completed", days=2.1) for _ in range(3)]
    young = old_job(stack, org, user.id, status="completed", days=1.9)
    purge(stack, batch=-1)
    assert all(exists(stack, j) for j in old)
    assert purge(stack, batch=2147483647)["jobs_deleted"] >= 3
    assert not any(exists(stack, j) for j in old) and exists(stack, young)


@pytest.mark.parametrize("engine", ["app_db", "worker_db", "operator_db"])
@pytest.mark.parametrize("statement", [
    "UPDATE retention_policy SET keep_jobs = interval '1 second', keep_audit = interval '1 second'",
    "DELETE FROM retention_policy",
    "INSERT INTO retention_policy (singleton) VALUES (true)",
])
def test_no_application_role_may_change_the_policy(bare_stack: Stack, engine: str, statement: str):
    with pytest.raises(DBAPIError) as refused, transaction(getattr(bare_stack, engine)) as conn:
        conn.execute(text(statement))
    assert "permission denied for table retention_policy" in str(refused.value.orig)
    with bare_stack.admin() as conn:
        assert retention.read(conn) == DEFAULT_POLICY


def test_the_policy_is_set_and_shown_by_the_cli_and_by_db_upgrade(bare_stack: Stack):
    stack = bare_stack
    done = stack.cli("retention", "set", "--audit-days", "400", "--events-days", "10")
    assert done.returncode == 0, done.stderr
    shown = stack.cli("retention", "show")
    assert shown.stdout.splitlines() == ["jobs\t30 days", "results\t7 days", "events\t10 days",
                                         "audit\t400 days"]
    refused = stack.cli("retention", "set", "--jobs-days", "0")
    assert refused.returncode != 0 and "above 0" in refused.stderr
    assert stack.cli("retention", "set").returncode != 0
    # A deployment's SPACEJOBS_KEEP_* become the policy at `db upgrade`; the others stay.
    upgraded = stack.cli("db", "upgrade", SPACEJOBS_KEEP_JOBS_DAYS="90")
    assert upgraded.returncode == 0, upgraded.stderr
    with stack.admin() as conn:
        assert retention.read(conn) == retention.RetentionPolicy(
            jobs_days=90, results_days=7, events_days=10, audit_days=400)
