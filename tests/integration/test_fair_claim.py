"""Fair claiming, against the real claim (claim_jobs()) as the worker role: organizations in turn,
shares by weight, priority within an organization, and a lone job never starved by a flood."""

from __future__ import annotations

import re
import uuid
from collections import Counter

import psycopg
import pytest
from sqlalchemy import text

from spacejobs.models.db.engine import libpq_url
from spacejobs.models.db.roles import WORKER_ROLE
from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.kinds import RateLimit
from spacejobs.models.tenancy import accounts
from tests.kit.stack import Stack


def flood(stack: Stack, org: uuid.UUID, user: uuid.UUID, count: int, *, priority: int = 0) -> None:
    """Queued jobs as submit makes them, in bulk, through the owner role (test set-up)."""
    with stack.admin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds, max_attempts,"
            " priority) SELECT :org, :user, 'bench.noop', 30, 3, :priority"
            " FROM generate_series(1, :n)"), {"org": org, "user": user, "n": count,
                                               "priority": priority})


def tenant(stack: Stack, weight: int = 1) -> tuple[uuid.UUID, uuid.UUID]:
    org = stack.org()
    if weight != 1:
        with stack.admin() as conn:
            conn.execute(text("UPDATE organizations SET claim_weight = :w WHERE id = :org"),
                         {"w": weight, "org": org})
    return org, stack.user(org, role="member").id


@pytest.fixture()
def empty_queue(bare_stack: Stack) -> Stack:
    with bare_stack.admin() as conn:
        conn.execute(text("DELETE FROM jobs"))
    return bare_stack


def claim(stack: Stack, limit: int, after: uuid.UUID = store.NO_ORGANIZATION) -> store.Claimed:
    with transaction(stack.worker_db, actor="worker:fair") as conn:
        return store.claim_batch(conn, "fair", limit=limit, after_organization=after)


def test_a_lone_job_is_taken_by_the_first_claim_however_big_the_flood(empty_queue: Stack):
    stack = empty_queue
    big, big_user = tenant(stack)
    lone, lone_user = tenant(stack)
    flood(stack, big, big_user, 5000)
    flood(stack, lone, lone_user, 1)
    taken = claim(stack, 10)
    by_org = Counter(job.organization_id for job in taken)
    # Half the batch is the lone organization's share; it had one job, so the batch is short
    # rather than the share handed to the flood: a lock on a row not taken would only make
    # concurrent claimers skip it.
    assert by_org == {lone: 1, big: 5} and taken.more_due


def test_organizations_take_turns_around_the_ring(empty_queue: Stack):
    stack = empty_queue
    tenants = [tenant(stack) for _ in range(40)]  # more than one claim's worth of organizations
    for org, user in tenants:
        flood(stack, org, user, 3)
    served: Counter[uuid.UUID] = Counter()
    after = store.NO_ORGANIZATION
    for _ in range(4):
        taken = claim(stack, 20, after)
        served.update(job.organization_id for job in taken)
        after = taken.next_organization
    # 80 jobs taken from 40 organizations: every one served, none more than its share allows.
    assert set(served) == {org for org, _ in tenants}
    assert max(served.values()) - min(served.values()) <= 2


def test_a_heavier_weight_gets_a_bigger_share(empty_queue: Stack):
    stack = empty_queue
    heavy, heavy_user = tenant(stack, weight=3)
    light, light_user = tenant(stack)
    flood(stack, heavy, heavy_user, 100)
    flood(stack, light, light_user, 100)
    taken = Counter(job.organization_id for job in claim(stack, 40))
    assert taken[heavy] == 30 and taken[light] == 10


def test_higher_priority_first_within_an_organization_but_not_across(empty_queue: Stack):
    stack = empty_queue
    org, user = tenant(stack)
    other, other_user = tenant(stack)
    flood(stack, org, user, 10)
    flood(stack, org, user, 3, priority=5)
    flood(stack, other, other_user, 10)  # a normal organization is not starved by priorities
    with stack.admin() as conn:
        urgent = set(conn.execute(text("SELECT id FROM jobs WHERE priority = 5")).scalars())
    taken = claim(stack, 6)
    mine = [job for job in taken if job.organization_id == org]
    assert {job.id for job in mine} == urgent
    assert Counter(job.organization_id for job in taken)[other] == 3


def test_an_empty_claim_says_whether_jobs_were_due_behind_locks(empty_queue: Stack):
    stack = empty_queue
    org, user = tenant(stack)
    flood(stack, org, user, 1)
    assert len(claim(stack, 1)) == 1
    nothing = claim(stack, 1)
    assert list(nothing) == [] and not nothing.more_due  # the job is leased: nothing is due
    org2, user2 = tenant(stack)
    flood(stack, org2, user2, 2)
    with stack.worker_db.connect() as one, one.begin():
        store.claim_batch(one, "one", limit=2)
        with transaction(stack.worker_db) as two:
            second = store.claim_batch(two, "two", limit=1)
            assert list(second) == [] and second.more_due  # due, but locked by the first claim


def nested_plans(stack: Stack, sql: str) -> str:
    """The plans of every statement ``sql`` runs, functions and triggers included, as the worker
    role: auto_explain sends them to the client (loading it needs the admin connection)."""
    plans: list[str] = []
    with psycopg.connect(libpq_url(stack.admin_url)) as conn:
        conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
        for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                        "SET auto_explain.log_nested_statements = on",
                        "SET client_min_messages = log", f"SET ROLE {WORKER_ROLE}"):
            conn.execute(setting)
        conn.execute(sql).fetchall()
        conn.rollback()
    return "\n".join(plans)


def test_the_claim_reads_jobs_only_through_its_indexes_even_when_statistics_mislead_it(
        empty_queue: Stack):
    """Revision 0023. Statistics taken while the queue was full, then the queue drained: a
    planner free to choose scans a million finished rows to learn whether one more job is due
    (80 ms a claim in bench.throughput --scale). Here 5,000 rows show the same plan."""
    stack = empty_queue
    org, user = tenant(stack)
    flood(stack, org, user, 5000)
    with stack.admin() as conn:
        conn.execute(text("ANALYZE jobs"))
        conn.execute(text(
            "UPDATE jobs SET status = 'leased', attempts = 1, lease_token = gen_random_uuid(),"
            " lease_until = now() + interval '1 minute', leased_by = 'plans', started_at = now()"))
        conn.execute(text("UPDATE jobs SET status = 'completed', finished_at = now(),"
                          " lease_token = NULL, lease_until = NULL"))
    flood(stack, org, user, 20)
    plans = nested_plans(stack, "SELECT count(*) FROM claim_jobs('plans', 5, ARRAY[]::text[],"
                                " NULL, NULL)")
    # the ring from the heads, each organization's jobs from its key's head on (with one
    # organization in the statistics, through jobs_fair_claim_idx or jobs_claimable_idx: both
    # start at the head)
    assert "using claim_heads_newest_idx" in plans, plans
    assert re.findall(r"Index Cond: \(.*ROW\(run_after, created_at\) >= ROW\(", plans), plans
    assert not re.findall(r"(Seq Scan|Bitmap Heap Scan) on jobs", plans), plans


def test_the_fair_claim_reads_each_organizations_first_jobs_not_all_of_them(empty_queue: Stack):
    """With one kind in the statistics, `kind <> ALL (...)` looked like a filter no row passes,
    and the generic plan read every queued job of each organization through jobs_kind_claim_idx
    and sorted them: a claim's cost then grew with the queue (16 ms for 100 jobs from 8
    organizations of 5,000)."""
    stack = empty_queue
    for _ in range(8):
        org, user = tenant(stack)
        flood(stack, org, user, 5000)
    with stack.admin() as conn:
        conn.execute(text("ANALYZE jobs"))
    plans = nested_plans(stack, "SELECT count(*) FROM claim_jobs('plans', 100, ARRAY[]::text[],"
                                " NULL, NULL)")
    fair = next(plan for plan in plans.split("Query Text:") if "WITH open_orgs" in plan)
    assert "Index Scan using jobs_fair_claim_idx" in fair, fair
    assert "Scan using jobs_kind_claim_idx" not in fair, fair


def test_an_organization_whose_jobs_are_all_held_back_takes_no_share(empty_queue: Stack):
    stack = empty_queue
    later, later_user = tenant(stack)
    held, held_user = tenant(stack)
    full, full_user = tenant(stack)
    ready, ready_user = tenant(stack)
    for org, user in ((later, later_user), (held, held_user), (full, full_user),
                      (ready, ready_user)):
        flood(stack, org, user, 50)
    with stack.admin() as conn:
        # This one's kind may start once an hour, and did a moment ago.
        accounts.set_rate_limit(conn, full, "bench.noop", RateLimit(1, 3600))
        conn.execute(text("INSERT INTO rate_limit_windows (organization_id, kind, starts)"
                          " VALUES (:org, 'bench.noop', ARRAY[now()])"), {"org": full})
        conn.execute(text("UPDATE jobs SET run_after = now() + interval '1 hour'"
                          " WHERE organization_id = :org"), {"org": later})
        # Every job of this one waits behind the first of one sequence, which is running.
        conn.execute(text(
            "UPDATE jobs SET sequence_key = 'one', sequence_position = nextval('job_sequence_positions')"
            " WHERE organization_id = :org"), {"org": held})
        conn.execute(text(
            "UPDATE jobs SET status = 'leased', lease_token = gen_random_uuid(), attempts = 1,"
            " leased_by = 'elsewhere', lease_until = now() + interval '1 minute'"
            " WHERE id = (SELECT id FROM jobs WHERE organization_id = :org"
            "             ORDER BY sequence_position LIMIT 1)"), {"org": held})
    taken = claim(stack, 9)
    # A quarter of the batch each would leave most slots empty: the batch is the ready one's.
    assert Counter(job.organization_id for job in taken) == {ready: 9}
