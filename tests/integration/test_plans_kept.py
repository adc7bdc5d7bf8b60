"""What a job's life runs inside the database is planned once a session, not at every call.

A statement inside a PL/pgSQL function keeps its plan for the session, unless a plan made for
each call's values looks cheaper every time, and a SQL function that cannot be inlined plans
its body at every call: either way the planning is paid again by every submit, claim and
finish (revision 0058 found three such statements on the submit's path, planned at every
call, the planning costing several times their execution). The server's own count of plans
(pg_stat_statements with ``track = all`` and ``track_planning``, on a PostgreSQL of this test
alone) says whether any statement the functions and triggers run is planned at every call.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from spacejobs.models.db.engine import make_engine
from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import service
from spacejobs.models.jobs.service import Jobs
from spacejobs.models.kinds import get_kind, load_kinds
from spacejobs.tasks.engine.leases import Finished, WorkerLeases
from tests.kit.private_servers import PrivateServers
from tests.kit.stack import Stack, running_stack

load_kinds()

KIND = "bench.noop"
JOBS = 60
STATISTICS = """
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = 'all'
pg_stat_statements.track_planning = on
"""


@pytest.fixture()
def counted(tmp_path: Path) -> Iterator[tuple[Stack, Engine]]:
    """A stack on a PostgreSQL of this test alone that counts every statement's plans, and a
    superuser engine on the stack's database to read them."""
    for part in ("servers", "stack"):
        (tmp_path / part).mkdir()
    servers = PrivateServers(tmp_path / "servers")
    try:
        servers.postgres.stop()
        with (servers.postgres.pgdata / "postgresql.conf").open("a") as conf:
            conf.write(STATISTICS)
        servers.postgres.start()
        with running_stack(servers.servers, tmp_path / "stack") as stack:
            superuser = make_engine(stack.admin_url, pool_size=1)
            try:
                with superuser.begin() as conn:
                    conn.execute(text("CREATE EXTENSION pg_stat_statements"))
                yield stack, superuser
            finally:
                superuser.dispose()
    finally:
        servers.close()


def test_no_statement_of_a_jobs_life_is_planned_at_every_call(
        counted: tuple[Stack, Engine]) -> None:
    stack, superuser = counted
    org = stack.org()
    member = stack.user(org, role="member")
    # One session each: a statement is planned at most once a session when its plan is kept.
    app = make_engine(stack.app_url, pool_size=1)
    worker = make_engine(stack.worker_url, pool_size=1)
    try:
        jobs = Jobs(app)
        with superuser.begin() as conn:
            conn.execute(text("SELECT pg_stat_statements_reset()"))
        for _ in range(JOBS):
            with transaction(app, organization_id=org, user_id=member.id,
                             actor=f"user:{member.id}") as conn:
                jobs.submit(conn, KIND, {}, organization_id=org, requested_by=member.id)
        with transaction(app, organization_id=org, user_id=member.id,
                         actor=f"user:{member.id}") as conn:
            jobs.submit_many(conn, [service.JobRequest(KIND)] * JOBS, organization_id=org,
                             requested_by=member.id)
        leases = WorkerLeases(worker, "plans-probe")
        rules = get_kind(KIND).rules
        held = leases.finish_and_claim([], claim=1).leased
        finished = 0
        while held:
            leases.extend([(job.id, job.lease_token) for job in held])
            finished += len(held)
            held = leases.finish_and_claim([Finished(job, rules, {"ok": True}) for job in held],
                                           claim=1).leased
        assert finished == 2 * JOBS
    finally:
        app.dispose()
        worker.dispose()

    with superuser.begin() as conn:
        nested = conn.execute(text(
            "SELECT s.calls, s.plans, left(regexp_replace(s.query, '\\s+', ' ', 'g'), 120)"
            " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
            " WHERE d.datname = current_database() AND NOT s.toplevel")).all()
    # Every job went through the submit's, the claim's and the finish's functions and triggers.
    assert sum(calls for calls, _, _ in nested) > 10 * JOBS
    replanned = [f"{plans} plans in {calls} calls: {query}"
                 for calls, plans, query in nested if calls >= JOBS and plans > calls // 4]
    assert replanned == []
