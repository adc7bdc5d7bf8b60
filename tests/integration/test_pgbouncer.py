"""Through PgBouncer in transaction mode: many clients, few server connections, no tenant leaks.

Each test runs a PRIVATE pgbouncer (its own port and config, ``pool_mode = transaction``,
``default_pool_size = 2``) in front of the test database, so that many client connections take
turns on two server connections per role, transaction by transaction. The attack: many threads
as different organizations, every transaction scoped with ``set_config(..., true)`` as the
application does; each must see only its own organization's rows, and each new transaction must
find the server connection's scope empty. The controls show that the pooler really shares server
connections: a session-level ``set_config(..., false)`` IS seen by another client, psycopg's
prepared statements break, and a LISTEN hears nothing and stays behind.

Skipped only when the pgbouncer binary is missing (and failed instead in CI, which installs it).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from spacejobs.demo.projects import Projects
from spacejobs.models.db.engine import libpq_url, make_engine
from spacejobs.models.db.roles import APP_ROLE, WORKER_ROLE
from spacejobs.models.db.transaction import opened, scope, transaction
from spacejobs.models.jobs import waiting
from spacejobs.models.settings import reload_settings
from tests.conftest import submit
from tests.kit.processes import free_port
from tests.kit.programs import find_program
from tests.kit.stack import Stack
from tests.kit.waiting import wait_until

POOL_SIZE = 2
ADMIN_USER = "sj_bouncer_admin"  # the pooler's own console (SHOW POOLS, SHOW STATS)


class PgBouncer:
    """A private pgbouncer in front of one PostgreSQL server, on its own port."""

    def __init__(self, server_url: str, role_urls: list[str]) -> None:
        self.binary = find_program("pgbouncer", needed_by="the PgBouncer tests")
        server = conninfo_to_dict(libpq_url(server_url))
        if (server.get("host") or "").startswith("/"):
            # The embedded PostgreSQL listens only on a unix socket in a directory of its own
            # system user's, where a pooler (which will not run as root) does not get in: these
            # tests run against a TCP server, as in CI (DATABASE_URL).
            pytest.skip("PgBouncer tests need a PostgreSQL server on TCP (DATABASE_URL)")
        self.dir = Path(tempfile.mkdtemp(prefix="sj-pgbouncer-"))
        self.port = free_port()
        # Clients are trusted (a private listener on loopback); the file's passwords are what
        # pgbouncer logs in to the server with, when the server asks for one.
        users = [(make_url(url).username, make_url(url).password or "") for url in role_urls]
        (self.dir / "users.txt").write_text(
            "".join(f'"{user}" "{password}"\n' for user, password in [*users, (ADMIN_USER, "")]))
        (self.dir / "pgbouncer.ini").write_text(f"""\
[databases]
* = host={server.get("host") or "127.0.0.1"} port={server.get("port") or 5432}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir / "users.txt"}
admin_users = {ADMIN_USER}
pool_mode = transaction
default_pool_size = {POOL_SIZE}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 500
; a deadlock between transactions waiting for a server connection fails instead of hanging
query_wait_timeout = 30
""")
        argv = [self.binary, str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:
            # pgbouncer refuses to run as root; it reads its files after switching user.
            self.dir.chmod(0o755)
            argv[1:1] = ["-u", pwd.getpwnam("nobody").pw_name]
        self.log = self.dir / "pgbouncer.log"
        self._handle = self.log.open("wb")
        self.proc = subprocess.Popen(argv, stdout=self._handle, stderr=subprocess.STDOUT)

        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError("pgbouncer exited:\n" + self.log.read_text()[-3000:])
            return "process up" in self.log.read_text(errors="replace")

        wait_until(up, 10, lambda: "pgbouncer up\n" + self.log.read_text()[-3000:], interval=0.02)

    def url(self, role_url: str) -> str:
        """The same role and database, through the pooler."""
        # A unix-socket server (the embedded one) names its socket directory in the query.
        url = make_url(role_url).difference_update_query(["host", "port"])
        return url.set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)

    def show(self, what: str) -> list[dict[str, Any]]:
        """A table of the pooler's console (``SHOW POOLS``, ``SHOW STATS``, ...)."""
        with psycopg.connect(host="127.0.0.1", port=self.port, user=ADMIN_USER, dbname="pgbouncer",
                             autocommit=True, prepare_threshold=None) as conn:
            cur = conn.execute(f"SHOW {what}")
            names = [column.name for column in cur.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def stop(self) -> None:
        self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._handle.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture()
def pooled_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's engines as a deployment behind the pooler makes them."""
    monkeypatch.setenv("SPACEJOBS_DB_POOLER", "transaction")
    reload_settings()
    yield
    monkeypatch.undo()
    reload_settings()


@pytest.fixture()
def bouncer(bare_stack: Stack) -> Iterator[PgBouncer]:
    """A fresh pooler per test: a control that dirties a server connection leaves it behind."""
    started = PgBouncer(bare_stack.admin_url,
                        [bare_stack.app_url, bare_stack.worker_url, bare_stack.operator_url])
    try:
        yield started
    finally:
        started.stop()


def seed_orgs(stack: Stack, count: int, projects_each: int = 3) -> dict[uuid.UUID, set[str]]:
    """Organizations with projects of their own: {org: its project names}."""
    orgs: dict[uuid.UUID, set[str]] = {}
    for n in range(count):
        org = stack.org(f"pgb-{n}-{uuid.uuid4().hex[:6]}")
        with stack.admin() as conn:
            names = {Projects(conn, org).create(f"{org}-p{i}").name for i in range(projects_each)}
        orgs[org] = names
    return orgs


PROBE = text("SELECT current_setting('app.organization_id', true), pg_backend_pid()")
PROJECT_NAMES = text("SELECT name FROM projects")  # row-level security alone decides the rows


def test_many_tenants_share_two_server_connections_and_never_see_each_other(
        bare_stack: Stack, bouncer: PgBouncer, pooled_settings: None) -> None:
    orgs = seed_orgs(bare_stack, 6)
    threads_per_org, transactions_each = 2, 40
    engine = make_engine(bouncer.url(bare_stack.app_url), pool_size=len(orgs) * threads_per_org)
    found_at_start: list[str | None] = []
    leaks: list[str] = []
    orgs_by_backend: dict[int, set[uuid.UUID]] = defaultdict(set)
    done = Counter()
    lock = threading.Lock()

    def tenant(org: uuid.UUID, seed: int) -> None:
        rng = random.Random(seed)
        for n in range(transactions_each):
            try:
                with opened(engine, lambda conn: conn.execute(PROBE).one()) as (conn, (at_start, pid)):
                    # The application's own scoping, then only row-level security decides.
                    scope(conn, organization_id=org)
                    seen = {row.name for row in conn.execute(PROJECT_NAMES)}
                    scoped = conn.execute(PROBE).one()[0]
                    time.sleep(rng.random() * 0.004)  # hold the server connection a moment
                    with lock:
                        found_at_start.append(at_start)
                        orgs_by_backend[pid].add(org)
                        if seen != orgs[org] or scoped != str(org):
                            leaks.append(f"{org} saw {sorted(seen)} scoped as {scoped}")
                    if n % 5 == 4:
                        raise _RollBack  # a rolled-back scope must not stay behind either
                with lock:
                    done["committed"] += 1
            except _RollBack:
                with lock:
                    done["rolled back"] += 1

    threads = [threading.Thread(target=tenant, args=(org, i * 100 + k))
               for i, org in enumerate(orgs) for k in range(threads_per_org)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        pools = {row["user"]: row for row in bouncer.show("POOLS") if row["database"] == bare_stack.db_name}
    finally:
        engine.dispose()

    total = len(threads) * transactions_each
    assert sum(done.values()) == total and done["rolled back"] == total // 5
    assert leaks == []
    # Every transaction began on a server connection with no tenant in it.
    assert len(found_at_start) == total and all(not value for value in found_at_start)
    # ... and those were the pooler's two, shared: each served many organizations in turn.
    assert 1 <= len(orgs_by_backend) <= POOL_SIZE
    assert min(len(served) for served in orgs_by_backend.values()) >= 3
    assert pools[APP_ROLE]["sv_active"] + pools[APP_ROLE]["sv_idle"] + pools[APP_ROLE]["sv_used"] <= POOL_SIZE


class _RollBack(Exception):
    pass


def test_control_a_session_level_scope_does_leak_to_the_next_client(
        bare_stack: Stack, bouncer: PgBouncer) -> None:
    """What makes the test above able to fail: ``set_config(..., false)`` through the same
    pooler lands on a shared server connection, and another client is scoped by it."""
    (org_a, names_a), (org_b, _) = seed_orgs(bare_stack, 2).items()
    url = libpq_url(bouncer.url(bare_stack.app_url))
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as attacker, \
            psycopg.connect(url, autocommit=True, prepare_threshold=None) as victim:
        attacker.execute("SELECT set_config('app.organization_id', %s, false)", (str(org_a),))
        seen = []
        for _ in range(20):
            with victim.transaction():
                scoped, = victim.execute("SELECT current_setting('app.organization_id', true)").fetchone()
                rows = {name for name, in victim.execute("SELECT name FROM projects")}
            seen.append((scoped, rows))
        assert (str(org_a), names_a) in seen  # the victim never scoped itself, yet reads org A
        assert str(org_b) not in {scoped for scoped, _ in seen}
        # The same through a direct connection: never (a session belongs to one client).
        with psycopg.connect(libpq_url(bare_stack.app_url), autocommit=True) as direct:
            assert not direct.execute(
                "SELECT current_setting('app.organization_id', true)").fetchone()[0]


def test_control_prepared_statements_break_unless_the_pooler_is_configured(
        bare_stack: Stack, bouncer: PgBouncer, monkeypatch: pytest.MonkeyPatch) -> None:
    """psycopg prepares a statement on its fifth run: through the pooler that statement is on
    one server connection, missing (or its name taken) on the next. SPACEJOBS_DB_POOLER turns
    preparing off."""
    def run(engine: Engine) -> None:
        conns = [engine.connect() for _ in range(4)]
        try:
            for n in range(12):
                for conn in conns:
                    with conn.begin():
                        assert conn.execute(text("SELECT CAST(:n AS int)"), {"n": n}).scalar() == n
        finally:
            for conn in conns:
                conn.close()

    monkeypatch.delenv("SPACEJOBS_DB_POOLER", raising=False)
    reload_settings()
    plain = make_engine(bouncer.url(bare_stack.app_url), pool_size=4)
    with pytest.raises(DBAPIError) as raised:
        run(plain)
    plain.dispose()
    assert isinstance(raised.value.orig, (psycopg.errors.DuplicatePreparedStatement,
                                          psycopg.errors.InvalidSqlStatementName))
    monkeypatch.setenv("SPACEJOBS_DB_POOLER", "transaction")
    reload_settings()
    pooled = make_engine(bouncer.url(bare_stack.app_url), pool_size=4)
    try:
        run(pooled)
    finally:
        pooled.dispose()
        monkeypatch.undo()
        reload_settings()


def test_the_web_statement_timeout_holds_per_transaction_and_stays_there(
        bare_stack: Stack, bouncer: PgBouncer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A direct connection carries the web's timeout in its startup ``options``, which
    PgBouncer refuses; behind the pooler it is set inside each transaction instead."""
    monkeypatch.delenv("SPACEJOBS_DB_POOLER", raising=False)
    reload_settings()
    refused = make_engine(bouncer.url(bare_stack.app_url), pool_size=1, statement_timeout_ms=200)
    with pytest.raises(DBAPIError, match="unsupported startup parameter: options"), transaction(refused):
        pass
    refused.dispose()
    monkeypatch.setenv("SPACEJOBS_DB_POOLER", "transaction")
    reload_settings()
    web = make_engine(bouncer.url(bare_stack.app_url), pool_size=1, statement_timeout_ms=200)
    other = make_engine(bouncer.url(bare_stack.app_url), pool_size=1)
    try:
        with pytest.raises(DBAPIError) as raised, transaction(web) as conn:
            conn.execute(text("SELECT pg_sleep(2)"))
        assert isinstance(raised.value.orig, psycopg.errors.QueryCanceled)
        for _ in range(4):  # the other client gets the same server connections: no timeout there
            with transaction(other) as conn:
                assert conn.execute(text("SHOW statement_timeout")).scalar() == "0"
    finally:
        web.dispose()
        other.dispose()
        monkeypatch.undo()
        reload_settings()


def test_control_a_listen_through_the_pooler_hears_nothing_and_stays_behind(
        bare_stack: Stack, bouncer: PgBouncer) -> None:
    """Why a LISTEN needs a direct URL (SPACEJOBS_LISTEN_DATABASE_URL), or none at all."""
    channel = f"sj_pgb_{uuid.uuid4().hex[:8]}"
    url = libpq_url(bouncer.url(bare_stack.worker_url))
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as listener, \
            psycopg.connect(url, autocommit=True, prepare_threshold=None) as bystander, \
            psycopg.connect(libpq_url(bare_stack.worker_url), autocommit=True) as direct:
        listener.execute(f"LISTEN {channel}")
        direct.execute(f"NOTIFY {channel}, 'job'")
        assert list(listener.notifies(timeout=1.0, stop_after=1)) == []
        channels = [{name for name, in bystander.execute("SELECT pg_listening_channels()")}
                    for _ in range(10)]
        assert any(channel in found for found in channels)  # another client's server connection


def test_workers_and_web_through_the_pooler_run_every_job_once_in_its_own_organization(
        bare_stack: Stack, bouncer: PgBouncer, pooled_settings: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Real worker processes (two, one with a direct URL to LISTEN on and one without), beat
    and the web all through the pooler; jobs of two organizations submitted through the API."""
    stack = bare_stack
    orgs = seed_orgs(stack, 2, projects_each=4)
    users = {org: stack.user(org) for org in orgs}
    # This process waits for jobs (Jobs.wait) with a direct LISTEN, as a web process would.
    monkeypatch.setenv("SPACEJOBS_LISTEN_DATABASE_URL", stack.admin_url)
    reload_settings()
    through = {"SPACEJOBS_DB_POOLER": "transaction",
               "SPACEJOBS_WORKER_DATABASE_URL": bouncer.url(stack.worker_url),
               "SPACEJOBS_APP_DATABASE_URL": bouncer.url(stack.app_url),
               "SPACEJOBS_OPERATOR_DATABASE_URL": bouncer.url(stack.operator_url)}
    workers = [stack.start_worker(concurrency=2, **through,
                                  SPACEJOBS_LISTEN_DATABASE_URL=stack.admin_url),
               stack.start_worker(concurrency=2, **through)]
    beat = stack.start_beat(**through)
    app = stack.make_app(DATABASE_URL=bouncer.url(stack.app_url))
    client = app.test_client()
    submitted: dict[str, uuid.UUID] = {}
    kinds: dict[str, str] = {}
    try:
        for n in range(30):
            for org, user in users.items():
                kind = "projects_export" if n % 3 == 0 else "bench.noop"
                job = submit(client, org, user, kind)
                submitted[job["id"]] = org
                kinds[job["id"]] = kind
        jobs = app.extensions["spacejobs.jobs"]  # the web's own job API, through the pooler
        outcomes = {job_id: jobs.wait(uuid.UUID(job_id), 60, organization_id=org)
                    for job_id, org in submitted.items()}
        # A waiter hears a finish through its direct LISTEN, not by re-reading the row later.
        org, user = next(iter(users.items()))
        with ThreadPoolExecutor(1) as pool, stack.workers_paused():
            job_id = submit(client, org, user, "bench.noop")["id"]
            waiter = pool.submit(jobs.wait, uuid.UUID(job_id), 30, organization_id=org)
            time.sleep(0.5)  # its first read finds the job queued
            resumed = time.monotonic()
        assert waiter.result().job.status == "completed"
        heard_after = time.monotonic() - resumed
        stats = {row["database"]: row for row in bouncer.show("STATS")}[stack.db_name]
        clients = bouncer.show("CLIENTS")
        servers = [row for row in bouncer.show("SERVERS") if row["database"] == stack.db_name]
    finally:
        stack.retire(*workers, beat)
        app.extensions["spacejobs.db"].dispose()
        app.extensions["spacejobs.operator_db"].dispose()

    assert all(outcome.job.status == "completed" for outcome in outcomes.values())
    assert heard_after < waiting.RECHECK - 1, heard_after
    for job_id, org in submitted.items():
        row = stack.job_row(job_id)
        assert row["organization_id"] == org and row["attempts"] == 1
        into_completed = [e for e in stack.events(job_id) if e["to_status"] == "completed"]
        assert len(into_completed) == 1, stack.events(job_id)
        if kinds[job_id] == "projects_export":
            # The export ran in the job's organization: exactly its projects, nobody else's.
            names = {p["name"] for p in outcomes[job_id].result["projects"]}
            assert names == orgs[org]
            other = next(o for o in orgs if o != org)
            answer = client.get(f"/api/v1/orgs/{other}/jobs/{job_id}/result", headers=users[other].auth)
            assert answer.status_code == 404
    # The traffic really went through the pooler, on at most two server connections per role.
    assert stats["total_xact_count"] > 2 * len(submitted)  # a POST and a read each, at least
    names = {row.get("application_name", "") for row in clients}
    assert any(name.startswith("spacejobs-worker:") for name in names), names
    per_role = Counter(row["user"] for row in servers)
    assert {WORKER_ROLE, APP_ROLE} <= set(per_role), per_role
    assert all(count <= POOL_SIZE for count in per_role.values()), per_role
