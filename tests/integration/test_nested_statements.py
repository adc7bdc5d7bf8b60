"""What a job's life runs inside the database, statement by statement, as the server counts it
(pg_stat_statements with ``track = all`` and ``track_planning``, on a PostgreSQL of each test
alone, so no other test's transaction holds vacuum back).

Planned once a session, not at every call. A statement inside a PL/pgSQL function keeps its
plan for the session, unless a plan made for each call's values looks cheaper every time, and a
SQL function that cannot be inlined plans its body at every call: either way the planning is
paid again by every submit, claim and finish (revision 0058 found three such statements on the
submit's path, the planning costing several times their execution).

Read by key behind a long-open transaction. A submit counts the organization's active jobs,
updates its count rows and lowers its claim head: small tables whose rows change with every
submit and finish of every organization. A scan of them (sequential, or a bitmap scan of a key
column) reads every version a REPEATABLE READ transaction left open still keeps, of every
organization; an index probe reads the organization's own. A long-lived session is what makes
the scan: PL/pgSQL keeps the plan it made while the table was small (revision 0055). The plans
themselves are read (auto_explain, the web role's sessions): without that revision's settings
the count update, then a join of its arrays to the table, was a bitmap scan of the count rows
by their third column, the slot (29 buffers a call behind the transaction against 5.5 before
it), and with them, planned once a session (revision 0058 as first written), an index scan by
the slot; it now updates each key by the whole key.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from spacejobs.models.db.engine import make_engine
from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import service, store
from spacejobs.models.jobs.service import Jobs
from spacejobs.models.kinds import get_kind, load_kinds
from spacejobs.tasks.engine.leases import Finished, WorkerLeases
from spacejobs.tasks.maintenance.claim_heads import ClaimHeads
from tests.integration.maintenance_kit import as_beat, drain_queue, report_left_open
from tests.kit.private_servers import PrivateServers
from tests.kit.stack import Stack, running_stack

load_kinds()

KIND = "bench.noop"
JOBS = 60
STATISTICS = """
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = 'all'
pg_stat_statements.track_planning = on
logging_collector = on
log_directory = 'collected_log'
"""


@pytest.fixture()
def counted(tmp_path: Path) -> Iterator[tuple[Stack, Engine, PrivateServers]]:
    """A stack on a PostgreSQL of this test alone that counts every statement's plans and keeps
    its log in its data directory, a superuser engine on the stack's database, and the
    servers."""
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
                yield stack, superuser, servers
            finally:
                superuser.dispose()
    finally:
        servers.close()


def submit_singles(app: Engine, org: uuid.UUID, member: uuid.UUID, submits: int = 20) -> None:
    """Single submits of one organization, each its own transaction, as the web makes them."""
    jobs = Jobs(app)
    for _ in range(submits):
        with transaction(app, organization_id=org, user_id=member,
                         actor=f"user:{member}") as conn:
            jobs.submit(conn, KIND, {}, organization_id=org, requested_by=member)


def test_no_statement_of_a_jobs_life_is_planned_at_every_call(
        counted: tuple[Stack, Engine, PrivateServers]) -> None:
    stack, superuser, _ = counted
    org = stack.org()
    member = stack.user(org, role="member")
    # One session each: a statement is planned at most once a session when its plan is kept.
    app = make_engine(stack.app_url, pool_size=1)
    worker = make_engine(stack.worker_url, pool_size=1)
    try:
        with superuser.begin() as conn:
            conn.execute(text("SELECT pg_stat_statements_reset()"))
        submit_singles(app, org, member.id, JOBS)
        with transaction(app, organization_id=org, user_id=member.id,
                         actor=f"user:{member.id}") as conn:
            Jobs(app).submit_many(conn, [service.JobRequest(KIND)] * JOBS, organization_id=org,
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


#: the small tables every organization's submits and finishes change
SMALL_TABLES = ("active_job_counts", "claim_heads")
#: the small tables' scans in a plan: a sequential scan, or an index's with its condition
SCANS = re.compile(r"Seq Scan on (active_job_counts|claim_heads)\b"
                   r"|(?:Index Scan(?: Backward)? using|Bitmap Index Scan on)"
                   r" (active_job_counts_pkey|claim_heads_newest_idx)\b[^\n]*\n\s*Index Cond: ([^\n]*)")


def scans_of_every_organization(plans: str) -> list[str]:
    """The small tables' scans that do not start from one organization's key: they read every
    organization's row versions."""
    return sorted({found[0] or f"{found[1]} by {found[2]}" for found in SCANS.findall(plans)
                   if found[0] or "organization_id =" not in found[2]})


def explain_role(superuser: Engine, role: str, *, counted: bool = False) -> None:
    """The plan of every statement ``role``'s new sessions run, functions' and triggers'
    included, in the server's log (auto_explain; the role's settings, on this server alone);
    ``counted``: with each node's rows and loops as it ran (no timing)."""
    settings = [("session_preload_libraries", "auto_explain"),
                ("auto_explain.log_min_duration", "0"),
                ("auto_explain.log_nested_statements", "on")]
    if counted:
        settings += [("auto_explain.log_analyze", "on"), ("auto_explain.log_timing", "off")]
    with superuser.begin() as conn:
        for setting, value in settings:
            conn.execute(text(f"ALTER ROLE {role} SET {setting} = '{value}'"))


def server_log(servers: PrivateServers) -> str:
    return "".join(path.read_text(errors="replace")
                   for path in sorted((servers.postgres.pgdata / "collected_log").iterdir()))


def busy_history(stack: Stack, org: uuid.UUID, owner: uuid.UUID, rounds: int = 300) -> None:
    """An organization's jobs one at a time, as single submits and finishes write them: each a
    version of its count row (on submit and on finish), and a version of its claim head each
    round (the chore moves it on past the finished ones)."""
    chore, beat = ClaimHeads(interval=1, lag=0.0), as_beat(stack)
    for _ in range(rounds):
        with stack.admin() as conn:
            for _ in range(5):
                conn.execute(text(
                    "INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds,"
                    " max_attempts) VALUES (:org, :owner, :kind, 30, 3)"),
                    {"org": org, "owner": owner, "kind": KIND})
        with transaction(stack.worker_db, actor="worker:w1") as conn:
            leased = store.claim_batch(conn, "w1", limit=5)
            assert len(leased) == 5
            for job in leased:
                store.complete_batch(conn, [(job.id, job.lease_token, {}, None)])
        chore.run(beat)


def test_behind_a_long_open_transaction_a_submit_reads_the_small_tables_by_key(
        counted: tuple[Stack, Engine, PrivateServers]) -> None:
    stack, superuser, servers = counted
    org, busy = stack.org(), stack.org()
    member = stack.user(org, role="member").id
    busy_owner = stack.user(busy, role="owner").id
    explain_role(superuser, "space_app")
    # One session throughout, as the web's pooled connection: PL/pgSQL keeps the plans it made
    # while the tables were small, and a scan of a small table is the cheapest plan there is.
    app = make_engine(stack.app_url, pool_size=1)
    try:
        submit_singles(app, org, member)
        drain_queue(stack)  # the claims below are the other organization's alone
        with report_left_open(stack):
            busy_history(stack, busy, busy_owner)
            submit_singles(app, org, member)
    finally:
        app.dispose()
    plans = server_log(servers)
    # Behind the transaction the other organization's thousands of versions of its count row
    # and head lie in these tables' pages, which a sequential scan reads, and so does a scan of
    # the count rows' key by its third column, the slot: the count update's bitmap scan without
    # revision 0055, and its generic plan when it joined its arrays to the table.
    assert scans_of_every_organization(plans) == []
    # the plans are there: each of the 40 submits probed the count rows' and the heads' keys
    assert plans.count("Index Scan using active_job_counts_pkey") >= 40
    assert plans.count("Index Scan using claim_heads_newest_idx") >= 40


#: a node that read the list of leases a statement was given (an unnest in its FROM), and how
#: many times it ran
LEASES_READ = re.compile(r"Function Scan on (?:unnest|l|d|held)\b[^\n]*\bloops=(\d+)\)")


def test_a_batch_of_leases_is_read_once_a_statement_whatever_its_size(
        counted: tuple[Stack, Engine, PrivateServers]) -> None:
    """A worker hands its leases back as lists (a heartbeat, the requester's standing, a
    finish, a release). Joined to their rows by nested loop, each row read the whole list again
    and was compared with every lease: a batch cost the square of its size (a finish of 1,000
    leases, 200 us a job against 35). PL/pgSQL plans a statement for each call's values five
    times, then keeps a plan made for any values (the one that read the list a row), so the
    same session makes more calls than that."""
    stack, superuser, servers = counted
    org = stack.org()
    member = stack.user(org, role="member").id
    explain_role(superuser, "space_worker", counted=True)
    rounds, batch = 8, 40
    with transaction(stack.app_db, organization_id=org, user_id=member,
                     actor=f"user:{member}") as conn:
        Jobs(stack.app_db).submit_many(conn, [service.JobRequest(KIND)] * (rounds * batch),
                                       organization_id=org, requested_by=member)
    worker = make_engine(stack.worker_url, pool_size=1)
    try:
        for _ in range(rounds):
            with transaction(worker, actor="worker:w1") as conn:
                leases = [(job.id, job.lease_token)
                          for job in store.claim_batch(conn, "w1", limit=batch)]
            assert len(leases) == batch
            with transaction(worker, actor="worker:w1") as conn:
                assert len(store.extend_leases(conn, leases)) == batch
                assert len(store.lease_standing(conn, leases)) == batch
                half = batch // 2
                done = store.complete_batch(conn, [(job_id, token, {}, None)
                                                   for job_id, token in leases[:half]])
                assert len(done) == half
                assert len(store.release_batch(conn, leases[half:])) == batch - half
    finally:
        worker.dispose()
    plans = server_log(servers)
    reads = [int(loops) for loops in LEASES_READ.findall(plans)]
    # each of the four statements, in every round, read its list of leases
    assert len(reads) >= 4 * rounds
    assert max(reads) == 1
