"""Row-level security, grants and the transition trigger, proven AS THE APPLICATION ROLES.

Superusers and BYPASSRLS roles skip every policy, so every assertion here runs on connections
of space_app, space_worker or space_operator (checked by ``roles``). The owner role is used only
to seed, as the CLI does. No worker processes: the module drives the job store itself.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from spacejobs.demo.projects import Projects
from spacejobs.models.db.engine import make_engine
from spacejobs.models.db.roles import APP_ROLE, OPERATOR_ROLE, OWNER_ROLE, WORKER_ROLE
from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.jobs.records import LeasedJob
from spacejobs.models.kinds import get_kind
from tests.integration.leasing import claim_one, complete_one
from tests.kit.stack import Stack

TENANT_TABLES = ("projects", "memberships", "job_events", "job_history")


def rls_violation(table: str) -> str:
    return f'new row violates row-level security policy for table "{table}"'


@dataclass
class Roles:
    app: Engine
    worker: Engine
    operator: Engine


@dataclass
class Tenant:
    id: uuid.UUID
    user: uuid.UUID
    projects: list[str]
    jobs: list[str]


@dataclass
class World:
    a: Tenant
    b: Tenant
    completed_job: str  # in A
    queued_job: str  # in A


@pytest.fixture(scope="module")
def roles(bare_stack: Stack) -> Roles:
    found = Roles(app=bare_stack.app_db, worker=bare_stack.worker_db, operator=bare_stack.operator_db)
    # The point of this module: none of these connections is a superuser.
    for engine, role in ((found.app, APP_ROLE), (found.worker, WORKER_ROLE),
                         (found.operator, OPERATOR_ROLE)):
        with engine.connect() as conn:
            row = conn.execute(text(
                "SELECT current_user, session_user, r.rolsuper, r.rolbypassrls"
                " FROM pg_roles r WHERE r.rolname = current_user")).one()
        assert tuple(row) == (role, role, False, False)
    return found


def submit(app: Engine, org: uuid.UUID, user: uuid.UUID, kind: str = "bench.noop") -> str:
    with transaction(app, organization_id=org, user_id=user, actor="test") as conn:
        job, created = store.submit(conn, [store.NewJob(get_kind(kind).rules, {})],
                                    organization_id=org, requested_by=user)[0]
    assert created == "created"
    return str(job.id)


def seed_tenant(stack: Stack, roles: Roles, name: str) -> Tenant:
    org = stack.org(name=name)
    user = stack.user(org, role="owner").id
    with transaction(roles.app, organization_id=org, user_id=user) as conn:
        projects = [str(Projects(conn, org).create(f"{name}-{i}").id) for i in range(2)]
    return Tenant(org, user, projects, [submit(roles.app, org, user)])


@pytest.fixture(scope="module")
def world(bare_stack: Stack, roles: Roles) -> World:
    a = seed_tenant(bare_stack, roles, "rls-a")
    b = seed_tenant(bare_stack, roles, "rls-b")
    # Finish every job so far through the real claim and fenced finish, as a worker would.
    while (leased := _claim(roles.worker)) is not None:
        with transaction(roles.worker, actor="test-worker") as conn:
            assert complete_one(conn, leased.id, leased.lease_token, {"secret": "result-data"})
    completed = a.jobs[0]
    queued = submit(roles.app, a.id, a.user)
    a.jobs.append(queued)
    b.jobs.append(submit(roles.app, b.id, b.user))
    return World(a, b, completed, queued)


def _claim(worker: Engine):
    with transaction(worker, actor="test-worker") as conn:
        return claim_one(conn, "test-worker")


def count(conn, table: str) -> int:
    return conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()


# ----------------------------------------------------------------------------- no tenant in scope

@pytest.mark.parametrize("table", [*TENANT_TABLES, "jobs", "organizations", "org_audit"])
def test_app_role_without_organization_sees_no_rows(roles: Roles, world: World, table: str):
    with roles.app.begin() as conn:  # no set_config at all
        assert count(conn, table) == 0
    with transaction(roles.app) as conn:  # our own helper, explicitly without a tenant
        assert count(conn, table) == 0


@pytest.mark.parametrize("table", TENANT_TABLES)
def test_worker_role_without_organization_sees_no_tenant_rows(roles: Roles, world: World, table: str):
    with roles.worker.begin() as conn:
        assert count(conn, table) == 0


def test_worker_role_reads_the_shared_queue_across_organizations_but_no_tenant_data(
        roles: Roles, world: World):
    """By design (DESIGN.md §3): the worker's own policy on jobs spans organizations."""
    with roles.worker.begin() as conn:
        seen = set(conn.execute(text("SELECT organization_id FROM jobs")).scalars())
        assert {world.a.id, world.b.id} <= seen
        assert count(conn, "projects") == 0
        assert count(conn, "memberships") == 0


def test_worker_role_sees_the_tenant_rows_of_a_lease_it_presents_and_no_others(
        bare_stack: Stack, roles: Roles, world: World):
    """Scoping itself to an organization is not enough for the worker role: its policies on
    tenant tables admit the organization of a job whose lease token the transaction presents
    (lease_org(), revision 0039), while that token holds the lease."""
    # A's queued job, leased by hand (the claim would take whichever is due first), given
    # back at the end as a worker's shutdown does.
    with bare_stack.admin() as conn:
        token = conn.execute(text(
            "UPDATE jobs SET status = 'leased', lease_token = gen_random_uuid(), attempts = 1,"
            " lease_until = now() + interval '1 minute' WHERE id = :id RETURNING lease_token"),
            {"id": world.queued_job}).scalar_one()
    leased = LeasedJob(uuid.UUID(world.queued_job), world.a.id, world.a.user, "bench.noop", {}, 1,
                       3, token, 30, None)

    def seen(**scope: object) -> tuple[set[str], set[uuid.UUID], set[uuid.UUID]]:
        with transaction(roles.worker, **scope) as conn:
            return ({str(p) for p in conn.execute(text("SELECT id FROM projects")).scalars()},
                    set(conn.execute(text("SELECT organization_id FROM memberships")).scalars()),
                    set(conn.execute(text("SELECT id FROM organizations")).scalars()))

    assert seen(organization_id=world.a.id, lease=(leased.id, leased.lease_token)) == (
        set(world.a.projects), {world.a.id}, {world.a.id})
    # Attack: the organization alone, a made-up token, or A's lease while scoped to B.
    assert seen(organization_id=world.a.id) == (set(), set(), set())
    assert seen(organization_id=world.a.id, lease=(leased.id, uuid.uuid4())) == (set(), set(), set())
    assert seen(organization_id=world.b.id, lease=(leased.id, leased.lease_token))[0] == set(
        world.a.projects)
    with transaction(roles.worker, actor="test-worker") as conn:
        assert store.release_batch(conn, [(leased.id, leased.lease_token)]) == {leased.id}
    # Once the lease has ended, the token opens nothing.
    assert seen(organization_id=world.a.id, lease=(leased.id, leased.lease_token)) == (
        set(), set(), set())
    with transaction(roles.worker, organization_id=world.a.id) as conn:
        assert set(conn.execute(text("SELECT organization_id FROM job_events")).scalars()) == {
            world.a.id}
        # The births job_history reads from jobs, which the worker reads across organizations,
        # are its scoped organization's only, as its events are.
        assert set(conn.execute(text("SELECT organization_id FROM job_history")).scalars()) == {
            world.a.id}


# ----------------------------------------------------------------------------- tenant A in scope

def test_app_role_scoped_to_a_sees_only_as_projects_and_jobs(roles: Roles, world: World):
    with transaction(roles.app, organization_id=world.a.id) as conn:
        projects = {str(p) for p in conn.execute(text("SELECT id FROM projects")).scalars()}
        job_ids = {str(j) for j in conn.execute(text("SELECT id FROM jobs")).scalars()}
        event_orgs = set(conn.execute(text("SELECT organization_id FROM job_events")).scalars())
        history_orgs = set(conn.execute(text("SELECT organization_id FROM job_history")).scalars())
        b_by_id = conn.execute(text("SELECT count(*) FROM jobs WHERE id = ANY(CAST(:ids AS uuid[]))"),
                               {"ids": world.b.jobs}).scalar_one()
        b_projects = conn.execute(text("SELECT count(*) FROM projects WHERE organization_id = :org"),
                                  {"org": world.b.id}).scalar_one()
    assert projects == set(world.a.projects)
    assert job_ids == set(world.a.jobs)
    assert event_orgs == history_orgs == {world.a.id}
    assert b_by_id == 0 and b_projects == 0


def test_app_role_scoped_to_a_cannot_insert_a_project_for_b(bare_stack: Stack, roles: Roles,
                                                            world: World):
    with pytest.raises(DBAPIError, match=rls_violation("projects")), \
            transaction(roles.app, organization_id=world.a.id, user_id=world.a.user) as conn:
        conn.execute(text("INSERT INTO projects (organization_id, name) VALUES (:org, 'planted')"),
                     {"org": world.b.id})
    with bare_stack.admin() as conn:
        assert {str(p) for p in conn.execute(text(
            "SELECT id FROM projects WHERE organization_id = :org"), {"org": world.b.id}).scalars()
        } == set(world.b.projects)


def test_app_role_cannot_insert_a_job_directly_in_any_organization(roles: Roles, world: World):
    # Not even in its own scope: jobs are born only through submit_job() / submit_jobs().
    with pytest.raises(DBAPIError, match="permission denied for table jobs"), \
            transaction(roles.app, organization_id=world.a.id, user_id=world.a.user) as conn:
        conn.execute(
            text("INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds, max_attempts)"
                 " VALUES (:org, :user, 'bench.noop', 30, 3)"),
            {"org": world.b.id, "user": world.b.user})
    with roles.worker.begin() as conn:
        in_b = {str(j) for j in conn.execute(text("SELECT id FROM jobs WHERE organization_id = :org"),
                                             {"org": world.b.id}).scalars()}
    assert in_b == set(world.b.jobs)


def test_app_role_scoped_to_a_cannot_cancel_bs_jobs(roles: Roles, world: World):
    with transaction(roles.app, organization_id=world.a.id, user_id=world.a.user) as conn:
        cancelled = conn.execute(
            text("UPDATE jobs SET status = 'cancelled' WHERE organization_id = :org"),
            {"org": world.b.id}).rowcount
        assert cancelled == 0
    with roles.worker.begin() as conn:
        statuses = conn.execute(text("SELECT status, organization_id FROM jobs WHERE id = ANY("
                                     "CAST(:ids AS uuid[]))"), {"ids": world.b.jobs}).all()
        assert all(status != "cancelled" and org == world.b.id for status, org in statuses)


# ----------------------------------------------------------------------------- pooled connections

@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_tenant_setting_does_not_leak_to_the_next_transaction_on_the_same_connection(
        bare_stack: Stack, world: World, ending: str):
    engine = make_engine(bare_stack.app_url, pool_size=1)
    try:
        with pytest.raises(RuntimeError) if ending == "rollback" else contextlib.nullcontext(), \
                transaction(engine, organization_id=world.a.id, user_id=world.a.user) as conn:
            first_pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            assert count(conn, "projects") == len(world.a.projects)
            if ending == "rollback":
                raise RuntimeError("the request failed")

        with engine.begin() as conn:  # a plain transaction: nothing sets app.* here
            row = conn.execute(text(
                "SELECT pg_backend_pid(), current_setting('app.organization_id', true),"
                " current_setting('app.user_id', true), app_org(), app_user()")).one()
            assert row[0] == first_pid, "the pool must hand back the same connection"
            assert tuple(row[1:]) == ("", "", None, None)
            for table in (*TENANT_TABLES, "jobs", "organizations"):
                assert count(conn, table) == 0, table
    finally:
        engine.dispose()


# ----------------------------------------------------------------------------- operator

def test_operator_reads_job_metadata_across_organizations(roles: Roles, world: World):
    with roles.operator.begin() as conn:
        rows = conn.execute(text(
            "SELECT id, organization_id, kind, status, attempts, error_code, created_at FROM jobs")).all()
    seen = {str(row.id) for row in rows}
    assert set(world.a.jobs) | set(world.b.jobs) <= seen
    assert {row.organization_id for row in rows} >= {world.a.id, world.b.id}


@pytest.mark.parametrize("select", [
    "SELECT params FROM jobs",
    "SELECT result FROM jobs",
    "SELECT lease_token FROM jobs",
    "SELECT * FROM jobs",
    "SELECT id FROM jobs WHERE result IS NOT NULL",
    "SELECT id FROM projects",
])
def test_operator_cannot_read_params_result_lease_token_or_tenant_data(roles: Roles, world: World,
                                                                       select: str):
    with pytest.raises(DBAPIError, match="permission denied"), roles.operator.begin() as conn:
        conn.execute(text(select))


# ----------------------------------------------------------------------------- catalog

def test_every_tenant_table_has_row_level_security_enabled_and_forced(roles: Roles):
    with roles.operator.begin() as conn:
        rows = conn.execute(text(
            "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')"
            "   AND (c.relname = 'organizations' OR EXISTS ("
            "        SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid"
            "        AND a.attname = 'organization_id' AND a.attnum > 0 AND NOT a.attisdropped))"
            " ORDER BY c.relname")).all()
    tables = {row.relname: (row.relrowsecurity, row.relforcerowsecurity) for row in rows}
    assert {"organizations", "memberships", "projects", "jobs", "job_events",
            "job_diagnostics", "org_audit"} <= set(tables)
    unprotected = {name: flags for name, flags in tables.items() if flags != (True, True)}
    assert unprotected == {}


def test_no_application_role_is_superuser_or_bypasses_rls(roles: Roles):
    names = [OWNER_ROLE, APP_ROLE, WORKER_ROLE, OPERATOR_ROLE]
    with roles.app.begin() as conn:
        rows = conn.execute(text(
            "SELECT rolname, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = ANY(:names)"),
            {"names": names}).all()
    assert sorted(row.rolname for row in rows) == sorted(names)
    assert [row.rolname for row in rows if row.rolsuper or row.rolbypassrls] == []


@pytest.mark.parametrize("statement", [
    "SELECT id FROM jobs WHERE id = :id FOR UPDATE SKIP LOCKED",
    "UPDATE jobs SET run_after = now() WHERE id = :id",
    "SELECT lease_token FROM jobs WHERE id = :id",
])
def test_the_worker_locks_and_changes_jobs_only_through_the_functions_that_take_a_token(
        roles: Roles, world: World, statement: str):
    """Without the token, nothing (revision 0039): the claim, the fenced writes and the sweeps
    are functions; the worker role has no UPDATE on jobs (a FOR UPDATE lock needs it) and reads
    no lease token."""
    with pytest.raises(DBAPIError, match="permission denied for table jobs"), \
            roles.worker.begin() as conn:
        conn.execute(text(statement), {"id": world.queued_job})
    with roles.worker.begin() as conn:
        policies = conn.execute(text(
            "SELECT policyname, cmd, roles FROM pg_policies"
            " WHERE schemaname = 'public' AND tablename = 'jobs'")).all()
    update_roles = {role for p in policies if p.cmd in ("UPDATE", "ALL") for role in p.roles}
    assert WORKER_ROLE not in update_roles, policies


# ----------------------------------------------------------------------------- transition trigger

def test_worker_cannot_move_a_completed_job_back_to_queued(bare_stack: Stack, roles: Roles,
                                                          world: World):
    with pytest.raises(DBAPIError, match="permission denied for table jobs"), \
            transaction(roles.worker, actor="test-worker") as conn:
        conn.execute(text("UPDATE jobs SET status = 'queued', run_after = now() WHERE id = :id"),
                     {"id": world.completed_job})
    row = bare_stack.job_row(world.completed_job)
    assert (row["status"], row["result"]) == ("completed", {"secret": "result-data"})


def test_worker_cannot_jump_a_queued_job_to_completed(roles: Roles, world: World):
    with pytest.raises(DBAPIError, match="permission denied for table jobs"), \
            transaction(roles.worker, actor="test-worker") as conn:
        conn.execute(text("UPDATE jobs SET status = 'completed', result = '{}' WHERE id = :id"),
                     {"id": world.queued_job})
    with roles.worker.begin() as conn:
        status = conn.execute(text("SELECT status FROM jobs WHERE id = :id"),
                              {"id": world.queued_job}).scalar_one()
    assert status == "queued"
