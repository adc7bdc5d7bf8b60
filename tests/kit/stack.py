"""A stack: one database cloned from the migrated template, one Celery queue, an engine for
each role, the worker and beat processes serving them, and the Flask app in front.

Two stacks on the same servers never see each other's jobs or wake-ups, so tests (and other
people's test runs on a shared machine) can run side by side. Processes connect as their
application roles, derived from this stack's database (``models.db.roles.role_url``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, text

from spacejobs.models.db.engine import make_engine
from spacejobs.models.db.roles import APP_ROLE, OPERATOR_ROLE, WORKER_ROLE, role_url
from spacejobs.models.db.transaction import owner_transaction, transaction
from spacejobs.models.jobs.records import Status
from spacejobs.models.jobs.service import Jobs
from spacejobs.models.kinds import load_kinds
from spacejobs.models.ops import retention
from spacejobs.models.results.store import LocalResultStore
from spacejobs.tasks.wakeups import guard_key
from tests.kit import broker, facts, seeding
from tests.kit.processes import (
    BEAT_READY,
    REPO_ROOT,
    WORKER_READY,
    LoggedProcess,
    ProcessSet,
    answers_http,
    celery_beat_argv,
    celery_worker_argv,
    free_port,
)
from tests.kit.servers import Servers
from tests.kit.waiting import wait_until

#: New passwords at the least costs the settings allow (OWASP's least profile: 19 MiB, 2 passes,
#: 1 lane): the tests sign in hundreds of times, and the defaults (64 MiB, 3 passes over 4 lanes)
#: cost a quarter of a CPU second each. tests/unit/test_people.py holds the defaults.
PASSWORD_COSTS = {
    "SPACEJOBS_PASSWORD_MEMORY_KIB": "19456",
    "SPACEJOBS_PASSWORD_TIME_COST": "2",
    "SPACEJOBS_PASSWORD_PARALLELISM": "1",
}
#: what the test suite's processes run with: its own and the demo job kinds, and a sweeper quick enough
#: that a lost wake-up is noticed within a test's patience.
TEST_PROCESS_SETTINGS = {
    "SPACEJOBS_DEMO_KINDS": "1",
    "SPACEJOBS_EXTRA_KIND_MODULES": "tests.kinds",
    "SPACEJOBS_WAKEUP_GRACE": "1.5",
    "SPACEJOBS_SWEEP_INTERVAL": "0.5",
    # Every claim reads the operators' controls, so a test sees a pause take effect at once
    # (tests/unit/test_worker_process.py covers the cache a real worker keeps).
    "SPACEJOBS_CONTROLS_TTL": "0",
    **PASSWORD_COSTS,
}
# Set by the caller's environment for its own servers; a stack's processes must derive theirs
# from the stack's database instead.
_ROLE_URL_SETTINGS = ("SPACEJOBS_APP_DATABASE_URL", "SPACEJOBS_WORKER_DATABASE_URL",
                      "SPACEJOBS_OPERATOR_DATABASE_URL")


class Stack:
    """One cloned database, one Celery queue, and the worker/beat processes serving them.

    ``label`` names the database (``sj_<label>_<id>``), the queue (``sj-<label>-<id>``) and the
    engines' ``application_name``; ``process_settings`` are added to every process's
    environment.
    """

    def __init__(self, servers: Servers, log_dir: Path, *, label: str = "test",
                 process_settings: Mapping[str, str] = TEST_PROCESS_SETTINGS) -> None:
        self.servers = servers
        self.log_dir = log_dir
        self.label = label
        self.run_id = uuid.uuid4().hex[:10]
        self.db_name = f"sj_{label}_{self.run_id}"
        self.queue = f"sj-{label}-{self.run_id}"
        self.redis_url = servers.redis_url
        self.process_settings = dict(process_settings)
        self.admin_url = servers.create_database(self.db_name, template=servers.migrated_template())
        self.app_url = role_url(APP_ROLE, self.admin_url)
        self.worker_url = role_url(WORKER_ROLE, self.admin_url)
        self.operator_url = role_url(OPERATOR_ROLE, self.admin_url)
        name = f"spacejobs-{label}"
        # Engines connect lazily: one a test never uses costs nothing.
        self.admin_db: Engine = make_engine(self.admin_url, pool_size=1, application_name=name)
        self.app_db: Engine = make_engine(self.app_url, pool_size=2, application_name=name)
        self.worker_db: Engine = make_engine(self.worker_url, pool_size=2, application_name=name)
        self.operator_db: Engine = make_engine(self.operator_url, pool_size=1, application_name=name)
        self.processes = ProcessSet(log_dir)
        self._jobs: Jobs | None = None
        # The local results store this stack's web, workers and beat share.
        self.results_dir = log_dir / f"results-{self.run_id}"

    # -- processes ------------------------------------------------------------------------
    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a process serving this stack (``extra`` wins)."""
        env = {k: v for k, v in os.environ.items() if k not in _ROLE_URL_SETTINGS}
        env.update(
            DATABASE_URL=self.admin_url,
            REDIS_URL=self.redis_url,
            SPACEJOBS_QUEUE=self.queue,
            SPACEJOBS_BENCH_KINDS="1",
            SPACEJOBS_RESULTS_DIR=str(self.results_dir),
            # What its processes leave in a temporary directory (billiard's pymp-*, beat's
            # schedule) stays with the test's logs, not in /tmp.
            TMPDIR=str(self._tmp_dir()),
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        )
        env.update(self.process_settings)
        env.update(extra)
        return env

    def _tmp_dir(self) -> Path:
        path = self.log_dir / "tmp"
        path.mkdir(exist_ok=True)
        return path

    def start_worker(self, concurrency: int = 2, *, cwd: Path = REPO_ROOT,
                     **extra_env: str) -> LoggedProcess:
        """A Celery worker on this stack's queues, once it says it is ready; started from
        ``cwd`` (an application's own folder, whose modules it then imports first)."""
        name = f"w{len(self.processes)}-{uuid.uuid4().hex[:6]}"
        return self.processes.start(name, self.worker_argv(name, concurrency),
                                    self.env(**extra_env), ready=WORKER_READY, timeout=30, cwd=cwd)

    def worker_argv(self, name: str, concurrency: int, *, queue: str | None = None) -> list[str]:
        """The command of a worker on this stack's queues (or on ``queue``'s)."""
        return celery_worker_argv("spacejobs.tasks.celery_app", queue or self.queue, name, concurrency)

    def start_web(self, *, workers: int = 1, env: Mapping[str, str] | None = None,
                  timeout: float = 60, **extra_env: str) -> tuple[LoggedProcess, str]:
        """`spacejobs web` serving this stack on a free port, once it answers: the process and
        its base URL. ``extra_env`` is added to the stack's environment; ``env``, when given,
        is the whole environment instead (a test with kinds of its own)."""
        port = free_port()
        web = self.processes.start(
            f"web-{port}", [sys.executable, "-m", "spacejobs.webapp.cli", "web", "--port", str(port),
                            "--workers", str(workers)],
            dict(env) if env is not None else self.env(**extra_env))
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: web.check_alive() or answers_http(url + "/api/v1/openapi.json"),
                   timeout, lambda: "the web answering\n" + web.output()[-3000:], interval=0.2)
        return web, url

    def start_beat(self, **extra_env: str) -> LoggedProcess:
        name = f"beat{len(self.processes)}"
        return self.processes.start(name, celery_beat_argv(self.log_dir / f"{name}.schedule"),
                                    self.env(**extra_env), ready=BEAT_READY, timeout=30)

    def retire(self, *procs: LoggedProcess) -> None:
        """Kill processes a test started, so the next test of the module does not inherit them,
        nor the wake-up guard they leave: a worker killed with a wake-up it had taken but not
        started never clears the guard, and for SPACEJOBS_WAKEUP_COALESCE_MS every submit then
        counts on a wake-up that died with it. In production the sweeper re-signals those jobs;
        a test without beat would wait for nothing."""
        self.processes.stop(*procs)
        broker.redis_client(self.redis_url).delete(guard_key(self.queue))

    def workers_paused(self) -> contextlib.AbstractContextManager[None]:
        """Freeze every worker and beat (SIGSTOP) so a test can change the world between a
        submit and the claim; they resume, and pick the job up, when the block ends."""
        return self.processes.paused()

    def wake(self) -> None:
        """Publish one wake-up, as the web does after a submit."""
        from spacejobs.tasks.wakeups import WakeupPublisher

        assert WakeupPublisher(self.redis_url, self.queue).wake("manual")

    @property
    def jobs(self) -> Jobs:
        """The job API as application code has it, on this stack (as space_app; no wake-ups:
        the stack's workers hear the insert's NOTIFY). Its listener stops with the stack."""
        if self._jobs is None:
            load_kinds()  # as tasks.client.connect() does
            self._jobs = Jobs(self.app_db, operator_engine=self.operator_db)
        return self._jobs

    def stop(self) -> None:
        """Kill every process, close the engines, remove the queues and drop the database."""
        if self._jobs is not None:
            self._jobs.close()
        self.processes.stop_all()
        self.dispose_engines()
        try:
            broker.forget_queues(self.redis_url, self.queue, f"{self.queue}.sweep")
        finally:
            self.servers.drop_database(self.db_name)

    def dispose_engines(self) -> None:
        for engine in (self.admin_db, self.app_db, self.worker_db, self.operator_db):
            engine.dispose()

    # -- Flask ----------------------------------------------------------------------------
    def make_app(self, **config: Any) -> Any:
        """The web app on this stack, as ``space_app``; ``config`` overrides the defaults.

        Its failed-authentication budgets are far above the defaults: many tests send bad
        tokens on purpose, hundreds a minute through one app (every URL, every method), to see
        each one refused alike; tests/integration/test_failed_authentications.py sets its own.
        """
        from spacejobs.webapp import create_app

        unlimited = "100000 per minute"
        settings = {"TESTING": True, "DATABASE_URL": self.app_url, "BROKER_URL": self.redis_url,
                    "QUEUE": self.queue, "RATELIMIT_STORAGE_URI": "memory://",
                    "RESULTS_STORE": self.results(),
                    "FAILED_AUTH_RATE_LIMIT_ADDRESS": unlimited, "FAILED_AUTH_RATE_LIMIT_GLOBAL": unlimited}
        settings.update(config)
        return create_app(settings)

    def results(self) -> LocalResultStore:
        """The results store this stack's processes share (a directory of its own)."""
        return LocalResultStore(self.results_dir)

    # -- seeding through the owner role, as the CLI does ----------------------------------
    def admin(self) -> contextlib.AbstractContextManager[Connection]:
        """A transaction as the owner role (through the admin connection), for set-up and
        inspection no application role may do."""
        return owner_transaction(self.admin_db, actor=self.label)

    def cli(self, *args: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess[str]:
        """``spacejobs ARGS`` against this stack's database, as an operator runs it."""
        return subprocess.run([sys.executable, "-m", "spacejobs.webapp.cli", *args], input=stdin, text=True,
                              capture_output=True, env=self.env(**env), cwd=REPO_ROOT, timeout=60)

    def set_retention(self, **days: float) -> None:
        """Change the database's retention policy as the owner (``spacejobs retention set``):
        ``jobs_days``, ``results_days``, ``events_days``, ``audit_days``."""
        with self.admin() as conn:
            retention.change(conn, **days)

    def org(self, name: str | None = None, state: str = "active") -> uuid.UUID:
        return seeding.organization(self.admin_db, name, state)

    def user(self, org_id: uuid.UUID | None = None, role: str = "member", *,
             password: str | None = None) -> seeding.TestUser:
        return seeding.user(self.admin_db, org_id, role, password=password)

    def operator(self) -> seeding.TestUser:
        return seeding.operator(self.admin_db)

    def tenant(self, name: str) -> seeding.Tenant:
        return seeding.tenant(self.admin_db, name)

    def set_state(self, org_id: uuid.UUID, state: str) -> None:
        seeding.set_state(self.admin_db, org_id, state)

    def remove_member(self, org_id: uuid.UUID, user_id: uuid.UUID) -> None:
        seeding.remove_member(self.admin_db, org_id, user_id)

    # -- facts: job rows as the owner, events as the operator role ------------------------
    def job_row(self, job_id: str | uuid.UUID) -> dict[str, Any]:
        """The whole row, as the owner role: no application role may read all of it."""
        with self.admin() as conn:
            return facts.job_row(conn, job_id)

    def wait_for_lease_to_run_out(self, job_id: str | uuid.UUID, timeout: float = 15) -> None:
        """Until the database's clock is past the job's lease (a frozen worker's job is then
        anyone's to take), however long the kind's lease is."""
        def ran_out() -> bool:
            with self.admin() as conn:
                return conn.execute(text("SELECT lease_until < now() FROM jobs WHERE id = :id"),
                                    {"id": job_id}).scalar_one()

        wait_until(ran_out, timeout, interval=0.05, what=f"the lease of job {job_id} run out")

    def count_jobs(self, org: uuid.UUID) -> int:
        """How many jobs the organization has, in any state (as the owner)."""
        with self.admin() as conn:
            return conn.execute(text("SELECT count(*) FROM jobs WHERE organization_id = :o"),
                                {"o": org}).scalar_one()

    def events(self, job_id: str | uuid.UUID) -> list[dict[str, Any]]:
        with transaction(self.operator_db) as conn:
            return facts.job_events(conn, job_id)

    def job_counts(self, organization_id: uuid.UUID | None = None) -> Counter[Status]:
        with transaction(self.worker_db) as conn:
            return facts.counts_by_status(conn, organization_id)

    def wait_for(self, job_id: str | uuid.UUID, *statuses: str, timeout: float = 20) -> dict[str, Any]:
        """The job's row once its status is one of ``statuses``; fails with its events if not."""
        last: dict[str, Any] = {}

        def arrived() -> dict[str, Any] | None:
            last.update(self.job_row(job_id))
            return dict(last) if last["status"] in statuses else None

        return wait_until(arrived, timeout, interval=0.05, what=lambda: (
            f"job {job_id} {' or '.join(statuses)} (it is {last.get('status')}; "
            f"events {self.events(job_id)})"))


@contextlib.contextmanager
def running_stack(servers: Servers, log_dir: Path, **options: Any) -> Iterator[Stack]:
    """A stack that is stopped (processes, queues, database) when the block ends."""
    built = Stack(servers, log_dir, **options)
    try:
        yield built
    finally:
        built.stop()
