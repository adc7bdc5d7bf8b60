"""Least privilege, enforced by PostgreSQL and tried as an attacker would: every attack runs on a
connection of the role it attacks with (space_app, space_worker), never a superuser, and must
fail with a permission error while the data stays as it was.

The allowlist test keeps every grant and policy of the application roles in one reviewed file,
``privileges.txt`` beside this module: a new grant fails it until someone writes it down there.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from spacejobs.models.db.engine import libpq_url, make_engine
from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.kinds import get_kind
from spacejobs.tasks.engine.leases import Finished, WorkerLeases
from tests.integration.leasing import claim_one, complete_one
from tests.kit import facts
from tests.kit.stack import Stack

ALLOWLIST = Path(__file__).with_name("privileges.txt")
CATALOG = text(r"""
SELECT grantee || '  table ' || table_name || '  ' || string_agg(privilege_type, ', '
       ORDER BY privilege_type)
FROM information_schema.role_table_grants
WHERE grantee IN ('space_app', 'space_worker', 'space_operator', 'space_tenancy')
  AND table_schema = 'public'
GROUP BY grantee, table_name
UNION ALL
SELECT grantee || '  column ' || table_name || '.' || column_name || '  ' ||
       string_agg(privilege_type, ', ' ORDER BY privilege_type)
FROM information_schema.column_privileges c
WHERE grantee IN ('space_app', 'space_worker', 'space_operator', 'space_tenancy')
  AND table_schema = 'public'
  AND NOT EXISTS (SELECT 1 FROM information_schema.role_table_grants t
                  WHERE t.grantee = c.grantee AND t.table_name = c.table_name
                    AND t.privilege_type = c.privilege_type)
GROUP BY grantee, table_name, column_name
UNION ALL
SELECT r.rolname || '  function ' || p.oid::regprocedure::text || '  EXECUTE'
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
CROSS JOIN pg_roles r
WHERE n.nspname = 'public'
  AND r.rolname IN ('space_app', 'space_worker', 'space_operator', 'space_tenancy')
  AND has_function_privilege(r.oid, p.oid, 'EXECUTE')
  AND (p.prosecdef OR NOT has_function_privilege('public', p.oid, 'EXECUTE'))
UNION ALL
SELECT role || '  policy ' || tablename || '.' || policyname || '  ' || cmd || '  USING '
       || regexp_replace(coalesce(qual, '-'), '\s+', ' ', 'g') || '  CHECK '
       || regexp_replace(coalesce(with_check, '-'), '\s+', ' ', 'g')
FROM pg_policies, unnest(roles) AS role
WHERE schemaname = 'public' AND role IN ('space_app', 'space_worker', 'space_operator', 'space_tenancy')
UNION ALL
SELECT r.rolname || '  database  ' || concat_ws(', ',
       CASE WHEN has_database_privilege(r.oid, current_database(), 'CREATE') THEN 'CREATE' END,
       CASE WHEN has_database_privilege(r.oid, current_database(), 'TEMP') THEN 'TEMP' END,
       CASE WHEN has_database_privilege(r.oid, current_database(), 'CONNECT') THEN 'CONNECT' END)
FROM pg_roles r WHERE r.rolname IN ('space_app', 'space_worker', 'space_operator', 'space_tenancy')
ORDER BY 1
""")


@dataclass
class World:
    app: Engine
    worker: Engine
    org: uuid.UUID
    other_org: uuid.UUID
    user: uuid.UUID
    queued: uuid.UUID
    completed: uuid.UUID  # in other_org, with a result


@pytest.fixture(scope="module")
def world(bare_stack: Stack) -> Iterator[World]:
    stack = bare_stack
    app = make_engine(stack.app_url, pool_size=2)
    worker = make_engine(stack.worker_url, pool_size=2)
    org, other = stack.org(), stack.org()
    user = stack.user(org, role="owner").id
    other_user = stack.user(other, role="owner").id
    with transaction(app) as conn:
        done, _ = store.submit(conn, [store.NewJob(get_kind("bench.noop").rules, {})],
                               organization_id=other, requested_by=other_user)[0]
    with transaction(worker, actor="worker:test") as conn:
        leased = claim_one(conn, "test")
        assert complete_one(conn, leased.id, leased.lease_token, {"secret": "other tenant's"})
    with transaction(app) as conn:
        queued, _ = store.submit(conn, [store.NewJob(get_kind("bench.noop").rules, {})],
                                 organization_id=org, requested_by=user)[0]
    yield World(app, worker, org, other, user, queued.id, done.id)
    app.dispose()
    worker.dispose()


def refused(engine: Engine, sql: str, params: dict | None = None, **scope: object) -> str:
    """Run ``sql`` as the engine's role; it must fail. Returns the error's message."""
    with pytest.raises(DBAPIError) as failure, transaction(engine, **scope) as conn:
        conn.execute(text(sql), params or {})
    return str(failure.value.orig)


def test_every_grant_and_policy_of_the_application_roles_is_on_the_allowlist(bare_stack: Stack):
    with bare_stack.admin() as conn:
        actual = [line for (line,) in conn.execute(CATALOG)]
    expected = [line for line in ALLOWLIST.read_text().splitlines()
                if line and not line.startswith("#")]
    missing, extra = sorted(set(expected) - set(actual)), sorted(set(actual) - set(expected))
    assert not missing and not extra, (
        "grants or policies differ from tests/integration/privileges.txt\n"
        + "".join(f"  - {line}\n" for line in missing) + "".join(f"  + {line}\n" for line in extra))


# ------------------------------------------------------------------------- the web role

def test_web_cannot_insert_a_finished_job_with_a_forged_result(bare_stack: Stack, world: World):
    error = refused(world.app, "INSERT INTO jobs (organization_id, requested_by, kind, status,"
                    " result, lease_seconds, max_attempts, attempts, finished_at)"
                    " VALUES (:org, :user, 'bench.noop', 'completed', '{\"forged\": 1}', 30, 3, 1,"
                    " now())", {"org": world.org, "user": world.user},
                    organization_id=world.org, user_id=world.user)
    assert "permission denied for table jobs" in error
    with bare_stack.admin() as conn:
        assert conn.execute(text("SELECT count(*) FROM jobs WHERE result ? 'forged'")).scalar() == 0


@pytest.mark.parametrize("assignment", [
    "status = 'leased', lease_token = gen_random_uuid(), lease_until = now() + interval '1 hour'",
    "status = 'completed'",
    "result = '{\"forged\": 1}'",
    "max_attempts = 1000",
    "lease_seconds = 999999",
    "attempts = 0",
])
def test_web_cannot_walk_or_rewrite_a_job(bare_stack: Stack, world: World, assignment: str):
    before = bare_stack.job_row(world.queued)
    error = refused(world.app, f"UPDATE jobs SET {assignment} WHERE id = :id", {"id": world.queued},
                    organization_id=world.org, user_id=world.user, actor="worker:attacker")
    assert any(refusal in error for refusal in (
        "permission denied", "the web may only cancel", "cannot go from queued to completed"))
    assert bare_stack.job_row(world.queued) == before
    assert [e["actor"] for e in bare_stack.events(world.queued)] == [f"user:{world.user}"]


def test_web_may_still_cancel(bare_stack: Stack, world: World):
    with transaction(world.app, organization_id=world.org, user_id=world.user) as conn:
        job = store.submit(conn, [store.NewJob(get_kind("bench.noop").rules, {})],
                           organization_id=world.org, requested_by=world.user)[0].job
        assert store.request_cancel(conn, job.id, world.user).status == "cancelled"


@pytest.mark.parametrize("role", ["app", "worker"])
def test_no_application_role_writes_history_directly(world: World, role: str):
    engine = getattr(world, role)
    error = refused(engine, "INSERT INTO job_events (job_id, organization_id, to_status, attempt,"
                    " actor) VALUES (:job, :org, 'completed', 1, 'worker:attacker')",
                    {"job": world.queued, "org": world.org}, organization_id=world.org)
    assert "permission denied for table job_events" in error


@pytest.mark.parametrize("role", ["app", "worker"])
@pytest.mark.parametrize("attack", [
    # room under the cap for a flood: every count of the organization set to minus a million
    "UPDATE active_job_counts SET active = -1000000 WHERE organization_id = :org",
    "INSERT INTO active_job_counts VALUES (:org, 'bench.noop', 63, -1000000)",
    "SELECT add_active_jobs(ARRAY[CAST(:org AS uuid)], ARRAY['bench.noop'], ARRAY[-1000000])",
    # or learn how busy another organization is
    "SELECT sum(active) FROM active_job_counts",
    "SELECT recount_active_jobs()",
])
def test_no_application_role_moves_or_reads_the_count_the_cap_reads(bare_stack: Stack, world: World,
                                                                    role: str, attack: str):
    with bare_stack.admin() as conn:
        before = conn.execute(text("SELECT active_jobs(:org, NULL)"), {"org": world.org}).scalar()
    error = refused(getattr(world, role), attack, {"org": world.org}, organization_id=world.org)
    assert "permission denied for" in error
    with bare_stack.admin() as conn:
        assert conn.execute(text("SELECT active_jobs(:org, NULL)"), {"org": world.org}).scalar() == before
        assert facts.active_counts_off(conn) == 0


# ------------------------------------------------------------------------- the worker role

@pytest.mark.parametrize("column", ["result", "params", "*"])
def test_worker_reads_no_tenants_results_or_params(world: World, column: str):
    error = refused(world.worker, f"SELECT {column} FROM jobs WHERE id = :id",
                    {"id": world.completed})
    assert "permission denied for table jobs" in error


def test_worker_learns_params_only_of_the_jobs_it_claims(bare_stack: Stack, world: World):
    with transaction(world.app) as conn:
        mine, _ = store.submit(conn, [store.NewJob(get_kind("bench.sleep").rules, {"seconds": 0.25})],
                               organization_id=world.org, requested_by=world.user)[0]
    with transaction(world.worker, actor="worker:test") as conn:
        leased = store.claim_batch(conn, "test", limit=100)
        assert {str(j.id): j.params for j in leased}[str(mine.id)] == {"seconds": 0.25}
        for job in leased:
            assert complete_one(conn, job.id, job.lease_token, {})


@pytest.mark.parametrize("table", ["jobs", "job_events", "job_diagnostics"])
def test_worker_cannot_delete_history(bare_stack: Stack, world: World, table: str):
    with bare_stack.admin() as conn:
        before = conn.execute(text(f"SELECT count(*) FROM {table}")).scalar()
    error = refused(world.worker, f"DELETE FROM {table}")
    assert f"permission denied for table {table}" in error
    with bare_stack.admin() as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar() == before


# ------------------------------------------------------------------------- the organizations' audit log

def audit_log(stack: Stack) -> list[tuple]:
    with stack.admin() as conn:
        return [tuple(row) for row in conn.execute(text("SELECT * FROM org_audit ORDER BY id"))]


@pytest.mark.parametrize("role", ["app", "worker", "operator"])
@pytest.mark.parametrize("statement", [
    "UPDATE org_audit SET actor = 'user:someone-else', detail = '{}'",
    "UPDATE org_audit SET at = now() - interval '10 years'",
    "DELETE FROM org_audit",
    "TRUNCATE org_audit",
])
def test_no_application_role_rewrites_or_erases_the_audit_log(bare_stack: Stack, world: World,
                                                               role: str, statement: str):
    """Append-only: even scoped to its own organization as its owner, the web changes nothing."""
    engine = bare_stack.operator_db if role == "operator" else getattr(world, role)
    before = audit_log(bare_stack)
    assert any(entry[1] == world.org for entry in before)
    error = refused(engine, statement, organization_id=world.org, user_id=world.user)
    assert "permission denied for table org_audit" in error
    assert audit_log(bare_stack) == before


@pytest.mark.parametrize("role", ["worker", "operator"])
def test_only_the_web_appends_to_the_audit_log(bare_stack: Stack, world: World, role: str):
    engine = bare_stack.operator_db if role == "operator" else getattr(world, role)
    error = refused(engine, "INSERT INTO org_audit (organization_id, actor, action)"
                    " VALUES (:org, 'user:forged', 'member.remove')", {"org": world.org},
                    organization_id=world.org)
    assert "permission denied for table org_audit" in error


def test_the_web_appends_only_to_the_scoped_organizations_log(bare_stack: Stack, world: World):
    before = audit_log(bare_stack)
    error = refused(world.app, "INSERT INTO org_audit (organization_id, actor, action)"
                    " VALUES (:other, 'user:forged', 'member.remove')", {"other": world.other_org},
                    organization_id=world.org, user_id=world.user)
    assert 'new row violates row-level security policy for table "org_audit"' in error
    assert audit_log(bare_stack) == before


@pytest.mark.parametrize("call", ["SELECT purge_org_audit(1000)",
                                  "SELECT * FROM purge_finished_jobs(1000)"])
def test_the_web_may_not_run_retention(bare_stack: Stack, world: World, call: str):
    """Only the sweeper (the worker role) runs the owner's purges, and only past the database's
    policy (tests/integration/test_retention.py tries every argument)."""
    error = refused(world.app, call, organization_id=world.org, user_id=world.user)
    assert "permission denied for function purge_" in error


def test_only_the_web_lists_a_parents_unmade_steps_and_only_its_organizations(world: World):
    """job_unmade_steps() (revision 0045) reads owner-only tables: the worker may not call it,
    and the web learns nothing of a job outside its scoped organization, or with none."""
    call = "SELECT total, places, kinds FROM job_unmade_steps(:id, -1, 1000)"
    error = refused(world.worker, call, {"id": world.completed})
    assert "permission denied for function job_unmade_steps" in error
    for scope in ({"organization_id": world.org, "user_id": world.user}, {}):
        with transaction(world.app, **scope) as conn:
            assert conn.execute(text(call), {"id": world.completed}).one() == (None, [], [])


# ------------------------------------------------------------------------- the audit trigger

def test_no_role_may_create_a_temporary_table_to_shadow_history(world: World):
    for engine in (world.app, world.worker):
        error = refused(engine, "CREATE TEMP TABLE job_events (LIKE public.job_events)")
        assert "permission denied to create temporary tables" in error


def test_a_shadow_table_would_not_swallow_history_anyway(bare_stack: Stack, world: World):
    """Even if TEMP were granted again by mistake: the trigger writes public.job_events."""
    def database_acl(statement: str) -> None:  # as the database's owner, the admin itself
        with psycopg.connect(libpq_url(bare_stack.admin_url), autocommit=True) as conn:
            conn.execute(statement)

    database_acl(f'GRANT TEMPORARY ON DATABASE "{bare_stack.db_name}" TO space_app')
    try:
        with transaction(world.app, organization_id=world.org, user_id=world.user) as conn:
            conn.execute(text("CREATE TEMP TABLE job_events (LIKE public.job_events)"))
            job = store.submit(conn, [store.NewJob(get_kind("bench.noop").rules, {})],
                               organization_id=world.org, requested_by=world.user)[0].job
            store.request_cancel(conn, job.id, world.user)
            shadowed = conn.execute(text("SELECT count(*) FROM pg_temp.job_events")).scalar()
        assert shadowed == 0
        assert [e["to_status"] for e in bare_stack.events(job.id)] == ["queued", "cancelled"]
    finally:
        database_acl(f'REVOKE TEMPORARY ON DATABASE "{bare_stack.db_name}" FROM space_app')


# ------------------------------------------------------------------------- the membership re-check

def test_a_removal_waits_for_the_finish_that_checked_the_membership(bare_stack: Stack,
                                                                     world: World):
    """The worker's re-check holds the membership (FOR SHARE) until its finish commits: a removal
    cannot slip in between the check and the write."""
    stack = bare_stack
    org = stack.org()
    member = stack.user(org, role="member")
    with transaction(world.app) as conn:
        job = store.submit(conn, [store.NewJob(get_kind("bench.noop").rules, {})],
                           organization_id=org, requested_by=member.id)[0].job
    leases = WorkerLeases(world.worker, "lock-test")
    with transaction(world.worker, actor="worker:test") as conn:
        leased = [j for j in store.claim_batch(conn, "lock-test", limit=100) if j.id == job.id]
    finished: list[float] = []
    removed: list[float] = []
    entered = threading.Event()
    original = store.complete_batch

    def slow_complete(conn, completions):
        entered.set()
        time.sleep(1.0)  # between the check (already done) and the commit
        return original(conn, completions)

    def finish() -> None:
        store.complete_batch = slow_complete
        try:
            leases.finish_and_claim([Finished(leased[0], get_kind("bench.noop").rules, {})],
                                    claim=0)
        finally:
            store.complete_batch = original
        finished.append(time.monotonic())

    thread = threading.Thread(target=finish)
    thread.start()
    assert entered.wait(10)
    stack.remove_member(org, member.id)  # blocks until the finish commits
    removed.append(time.monotonic())
    thread.join(10)
    assert finished and removed and removed[0] >= finished[0] - 0.05
    assert stack.job_row(job.id)["status"] == "completed"


# ------------------------------------------------------------------------- the counters' one door

def counters(stack: Stack) -> dict[tuple[str, str], float]:
    """metric_counters after folding every recorded event, as the operator reads them."""
    with transaction(stack.worker_db, actor="sweeper") as conn:
        store.fold_metrics(conn)
    with transaction(stack.operator_db) as conn:
        return {(row.name, row.kind): row.value for row in conn.execute(text(
            "SELECT name, kind, value FROM metric_counters WHERE name LIKE 'spacejobs_wakeups_%'"))}


@pytest.mark.parametrize("kind, by", [
    ("", -1e9),                 # a counter that goes down reads as a reset to every rate()
    ("", float("nan")),         # and NaN or Infinity poison it for good
    ("", float("inf")),
    ("", 1e12),
    ("<script>alert(1)</script> and 10,000 more labels", 1),
    # a kind-shaped label is a new series too (the review's 200 calls made 200): the only
    # labels are the database's own kinds, which no caller passes (revision 0039)
    ("bench.noop", 1),
    ("made.up.kind.1", 1),
])
def test_the_web_cannot_move_a_counter_backwards_poison_it_or_grow_its_labels(
        bare_stack: Stack, world: World, kind: str, by: float):
    """Attack: as space_app, count_event('spacejobs_wakeups_published_total', '', -1e9)."""
    before = counters(bare_stack)
    with transaction(world.app, organization_id=world.org, user_id=world.user) as conn:
        conn.execute(text("SELECT count_event('spacejobs_wakeups_published_total', :kind, :by)"),
                     {"kind": kind, "by": by})
    assert counters(bare_stack) == before


def test_the_counters_door_still_counts_what_our_code_sends(bare_stack: Stack, world: World):
    before = counters(bare_stack).get(("spacejobs_wakeups_failed_total", ""), 0)
    with transaction(world.app) as conn:
        conn.execute(text("SELECT count_event('spacejobs_wakeups_failed_total', '', 3)"))
    assert counters(bare_stack)[("spacejobs_wakeups_failed_total", "")] == before + 3
