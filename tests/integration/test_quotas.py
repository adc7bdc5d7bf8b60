"""One member cannot starve everyone: a cap on each organization's active jobs, overridable per
kind and per organization, exact under concurrent submits from many threads."""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest
import requests
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from spacejobs.models.db.engine import libpq_url, make_engine
from spacejobs.models.db.transaction import transaction
from spacejobs.models.errors import DuplicateJob, InternalJobError
from spacejobs.models.jobs import service, store
from spacejobs.models.jobs.records import ACTIVE, sql_list
from spacejobs.models.jobs.service import Jobs
from spacejobs.models.ops import quota_policy
from spacejobs.models.tenancy import accounts
from tests.conftest import served
from tests.integration.leasing import complete_one
from tests.kit import facts
from tests.kit.stack import Stack


@pytest.fixture(scope="module")
def app(bare_stack: Stack):
    # No workers: every job submitted stays queued, so "active" is everything written.
    return bare_stack.make_app(SUBMIT_RATE_LIMIT="100000 per minute",
                               ORG_SUBMIT_RATE_LIMIT="100000 per minute")


def set_quota(stack: Stack, org: uuid.UUID, limit: int | None, kind: str | None = None) -> None:
    with stack.admin() as conn:
        accounts.set_quota(conn, org, limit, kind)


def active(stack: Stack, org: uuid.UUID, kind: str | None = None) -> int:
    with stack.admin() as conn:
        return conn.execute(text(
            "SELECT count(*) FROM jobs WHERE organization_id = :o AND (kind = :k OR :k IS NULL)"
            f" AND status IN {sql_list(ACTIVE)}"), {"o": org, "k": kind}).scalar_one()


def post(client, org, user, kind="bench.noop", key: str | None = None):
    headers = user.auth | ({"Idempotency-Key": key} if key else {})
    return client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": kind}, headers=headers)


def test_a_submit_over_the_organizations_cap_is_429_too_many_jobs_and_writes_nothing(bare_stack, client):
    org, other = bare_stack.org(), bare_stack.org()
    anna, olga = bare_stack.user(org), bare_stack.user(other)
    set_quota(bare_stack, org, 3)
    assert [post(client, org, anna).status_code for _ in range(3)] == [202, 202, 202]
    refused = post(client, org, anna)
    assert refused.status_code == 429
    assert refused.get_json()["error"]["code"] == "too_many_jobs"
    assert refused.get_json()["error"]["limit"] == 3
    assert int(refused.headers["Retry-After"]) > 0
    assert active(bare_stack, org) == 3
    # Another organization is not affected; a finished job makes room again.
    assert post(client, other, olga).status_code == 202
    job = client.get(f"/api/v1/orgs/{org}/jobs?limit=1", headers=anna.auth).get_json()["jobs"][0]
    assert client.post(job["links"]["cancel"], headers=anna.auth).status_code == 200
    assert post(client, org, anna).status_code == 202
    assert active(bare_stack, org) == 3


def test_the_largest_quota_is_no_quota_at_all(bare_stack, client):
    org = bare_stack.org()
    anna = bare_stack.user(org)
    set_quota(bare_stack, org, 2**31 - 1)  # what a benchmark sets: the counts must not overflow
    assert post(client, org, anna).status_code == 202
    batch = client.post(f"/api/v1/orgs/{org}/jobs:batch", headers=anna.auth,
                        json={"jobs": [{"kind": "bench.noop"}] * 3})
    assert batch.status_code == 202


def default_cap(stack) -> int:
    with stack.admin() as conn:
        return quota_policy.read(conn)


def test_the_default_cap_is_the_databases_policy_which_db_upgrade_and_the_cli_write(
        bare_stack, client):
    org = bare_stack.org()
    anna = bare_stack.user(org)
    upgraded = bare_stack.cli("db", "upgrade", SPACEJOBS_ACTIVE_JOBS_QUOTA="2")
    try:
        assert upgraded.returncode == 0, upgraded.stderr
        assert default_cap(bare_stack) == 2
        assert [post(client, org, anna).status_code for _ in range(3)] == [202, 202, 429]
        set_quota(bare_stack, org, 3)  # an operator's override wins over the default
        assert [post(client, org, anna).status_code for _ in range(2)] == [202, 429]
        # Without the setting, an upgrade keeps what the database holds.
        assert bare_stack.cli("db", "upgrade").returncode == 0
        assert default_cap(bare_stack) == 2
    finally:
        changed = bare_stack.cli("orgs", "set-default-quota", "1000")
    assert changed.returncode == 0 and changed.stdout.strip() == "default quota: 1000 active jobs"
    assert default_cap(bare_stack) == 1000


def test_a_kind_declares_its_own_quota_and_operators_override_it_per_organization(bare_stack, client):
    org = bare_stack.org()
    anna = bare_stack.user(org)
    assert [post(client, org, anna, "test.capped").status_code for _ in range(3)] == [202, 202, 429]
    refused = post(client, org, anna, "test.capped").get_json()["error"]
    assert refused["code"] == "too_many_jobs" and "test.capped" in refused["message"]
    assert post(client, org, anna, "bench.noop").status_code == 202  # other kinds still go
    set_quota(bare_stack, org, 3, kind="test.capped")
    assert [post(client, org, anna, "test.capped").status_code for _ in range(2)] == [202, 429]
    set_quota(bare_stack, org, None, kind="test.capped")  # back to the kind's own 2
    assert post(client, org, anna, "test.capped").status_code == 429
    assert active(bare_stack, org, "test.capped") == 3


def test_a_batch_is_admitted_whole_or_not_at_all(bare_stack, client):
    org = bare_stack.org()
    anna = bare_stack.user(org)
    set_quota(bare_stack, org, 5)
    batch = lambda n: client.post(f"/api/v1/orgs/{org}/jobs:batch", headers=anna.auth,  # noqa: E731
                                  json={"jobs": [{"kind": "bench.noop"}] * n})
    assert batch(4).status_code == 202
    refused = batch(2)
    assert refused.status_code == 429 and refused.get_json()["error"]["code"] == "too_many_jobs"
    assert active(bare_stack, org) == 4
    assert batch(1).status_code == 202 and active(bare_stack, org) == 5


def test_an_idempotent_replay_at_the_cap_answers_the_first_job(bare_stack, client):
    org = bare_stack.org()
    anna = bare_stack.user(org)
    set_quota(bare_stack, org, 1)
    first, again = post(client, org, anna, key="k1"), post(client, org, anna, key="k1")
    assert first.status_code == again.status_code == 202
    assert again.headers["Idempotent-Replayed"] == "true" and again.get_json()["id"] == first.get_json()["id"]
    assert post(client, org, anna, key="k2").status_code == 429


def test_eight_threads_submitting_at_once_never_pass_the_cap(bare_stack, app):
    """Real HTTP requests, eight at a time, singles and batches: the cap holds exactly."""
    org = bare_stack.org()
    members = [bare_stack.user(org) for _ in range(8)]
    cap = 60
    set_quota(bare_stack, org, cap)
    answers: list[tuple[int, int]] = []  # (status, jobs asked for)
    start = threading.Barrier(len(members))

    def hammer(url: str, member, index: int) -> None:
        with requests.Session() as http:
            http.headers.update(member.auth)
            start.wait()
            for attempt in range(16):
                if (index + attempt) % 4 == 0:
                    answer = http.post(f"{url}/api/v1/orgs/{org}/jobs:batch",
                                       json={"jobs": [{"kind": "bench.noop"}] * 3})
                    answers.append((answer.status_code, 3))
                else:
                    answer = http.post(f"{url}/api/v1/orgs/{org}/jobs", json={"kind": "bench.noop"})
                    answers.append((answer.status_code, 1))

    with served(app) as url:
        threads = [threading.Thread(target=hammer, args=(url, m, i)) for i, m in enumerate(members)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    assert {status for status, _ in answers} <= {202, 429}
    accepted = sum(n for status, n in answers if status == 202)
    assert active(bare_stack, org) == accepted <= cap
    # Refusals come only at the cap: with singles still arriving, it is filled (a batch of 3
    # may be refused at cap - 2).
    assert accepted >= cap - 2, answers


def test_submits_need_read_committed(bare_stack):
    org = bare_stack.org()
    anna = bare_stack.user(org)
    engine = make_engine(bare_stack.app_url, pool_size=1)
    try:
        with pytest.raises(DBAPIError, match="READ COMMITTED"), \
                engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn, \
                conn.begin():
            Jobs(conn.engine).submit(conn, "bench.noop", {}, organization_id=org, requested_by=anna.id)
    finally:
        engine.dispose()


def submit_beside_an_uncommitted_one(stack: Stack, org: uuid.UUID, user: uuid.UUID, *,
                                     patience: float) -> tuple[bool, object]:
    """T1 submits and, before T1 commits, T2 submits on another connection. Returns whether T2
    was still waiting after ``patience`` seconds, and what T2 got once T1 had committed (its
    ``Submitted``, or the error it raised)."""
    engine = make_engine(stack.app_url, pool_size=2)
    outcome: list[object] = []

    def submit(conn) -> object:
        return Jobs(conn.engine).submit(conn, "bench.noop", {}, organization_id=org, requested_by=user)

    def second() -> None:
        try:
            with engine.begin() as conn:
                outcome.append(submit(conn))
        except Exception as error:
            outcome.append(error)

    try:
        with engine.begin() as first:
            submit(first)
            racer = threading.Thread(target=second)
            racer.start()
            racer.join(timeout=patience)
            waited = racer.is_alive()
        racer.join(timeout=10)
    finally:
        engine.dispose()
    return waited, outcome[0] if outcome else None


def test_a_submit_not_yet_committed_counts_against_the_cap(bare_stack):
    """The interleaving a count alone gets wrong: T1 has written the last job the cap allows
    but not committed it; T2, which cannot see that row, must wait for T1 and then be refused,
    never admitted beside it."""
    org = bare_stack.org()
    anna = bare_stack.user(org)
    set_quota(bare_stack, org, 2)
    with bare_stack.app_db.begin() as conn:
        Jobs(conn.engine).submit(conn, "bench.noop", {}, organization_id=org, requested_by=anna.id)
    # T1 writes the second of two
    waited, outcome = submit_beside_an_uncommitted_one(bare_stack, org, anna.id, patience=1.0)
    assert waited, f"T2 did not wait for T1: {outcome}"
    assert type(outcome).__name__ == "TooManyJobs", outcome
    assert active(bare_stack, org) == 2


def test_two_transactions_that_each_submit_twice_never_both_wait_forever(bare_stack, app):
    """Each holds the stripe of its first submit while its second waits for every stripe: the
    deadlock detector rolls one back whole (nothing of it written), and the web answers that
    503 unavailable, to be tried again (SQLSTATE 40P01 is an OperationalError)."""
    from flask import Flask

    from spacejobs.webapp.errors import register

    org = bare_stack.org()
    anna, vera = bare_stack.user(org), bare_stack.user(org)
    engine = make_engine(bare_stack.app_url, pool_size=2)
    both_first = threading.Barrier(2)
    outcomes: list[object] = []

    def twice(user) -> None:
        try:
            with engine.begin() as conn:
                Jobs(conn.engine).submit(conn, "bench.noop", {}, organization_id=org, requested_by=user.id)
                both_first.wait(timeout=10)
                Jobs(conn.engine).submit_many(conn, [service.JobRequest("bench.noop")] * 2,
                                    organization_id=org, requested_by=user.id)
            outcomes.append("committed")
        except DBAPIError as error:
            outcomes.append(error)

    try:
        racers = [threading.Thread(target=twice, args=(u,)) for u in (anna, vera)]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(timeout=30)
    finally:
        engine.dispose()
    committed = outcomes.count("committed")
    assert committed >= 1 and len(outcomes) == 2, outcomes
    assert active(bare_stack, org) == 3 * committed
    for error in (o for o in outcomes if o != "committed"):
        probe = Flask("probe")
        register(probe)

        @probe.get("/")
        def boom(error=error):
            raise error

        answer = probe.test_client().get("/")
        assert answer.status_code == 503 and answer.get_json()["error"]["code"] == "unavailable"


# -- the count the cap reads (active_job_counts, revision 0024) -------------------------------


def counted(stack: Stack, org: uuid.UUID, kind: str | None = None) -> int:
    """What admit_jobs() reads for the cap, as the owner."""
    with stack.admin() as conn:
        return conn.execute(text("SELECT active_jobs(:o, :k)"), {"o": org, "k": kind}).scalar_one()


def counts_off(stack: Stack) -> int:
    with stack.admin() as conn:
        return facts.active_counts_off(conn)


def test_the_count_the_cap_reads_follows_every_way_a_job_starts_and_stops_being_active(bare_stack):
    org, gone = bare_stack.org(), bare_stack.org()
    anna, gina = bare_stack.user(org), bare_stack.user(gone)

    def step(what: str, noop: int, sleep: int) -> None:
        assert counts_off(bare_stack) == 0, what
        assert (counted(bare_stack, org, "bench.noop"), counted(bare_stack, org, "bench.sleep"),
                counted(bare_stack, org)) == (noop, sleep, noop + sleep), what
        assert active(bare_stack, org) == noop + sleep, what

    with bare_stack.app_db.begin() as conn:
        first = Jobs(conn.engine).submit(conn, "bench.noop", {}, organization_id=org, requested_by=anna.id)
    step("one submit", 1, 0)
    with bare_stack.app_db.begin() as conn:
        batch = Jobs(conn.engine).submit_many(
            conn, [service.JobRequest("bench.noop"), service.JobRequest("bench.sleep"),
                   service.JobRequest("bench.sleep", dedup_key="k")],
            organization_id=org, requested_by=anna.id)
    step("a batch of three", 2, 2)
    with pytest.raises(DuplicateJob), bare_stack.app_db.begin() as conn:
        Jobs(conn.engine).submit(conn, "bench.sleep", {}, organization_id=org, requested_by=anna.id,
                       dedup_key="k")
    step("a duplicate refused", 2, 2)
    with bare_stack.app_db.begin() as conn:
        Jobs(conn.engine).submit_many(conn, [service.JobRequest("bench.noop")] * 3,
                            organization_id=gone, requested_by=gina.id)
    with bare_stack.app_db.begin() as conn:
        jobs = Jobs(conn.engine)
        jobs.cancel(conn, jobs.member(conn, org, anna.id), first.job.id)
    step("a queued job cancelled by the web", 1, 2)
    with bare_stack.app_db.begin() as conn:
        Jobs(conn.engine).submit(conn, "bench.noop", {}, organization_id=org, requested_by=anna.id)
        conn.rollback()
    step("a submit rolled back", 1, 2)

    # The worker side: claim everything due (other tests' jobs too), then end them every way.
    with transaction(bare_stack.worker_db) as conn:
        leased = store.claim_batch(conn, "counter", limit=1000)
    ours = {job.id: job for job in leased if job.organization_id == org}
    assert len(ours) == 3
    step("claimed: still active", 1, 2)
    noop = next(job for job in ours.values() if job.kind == "bench.noop")
    sleeps = [job for job in ours.values() if job.kind == "bench.sleep"]
    with transaction(bare_stack.worker_db) as conn:
        assert complete_one(conn, noop.id, noop.lease_token, {"ok": True})
        assert not complete_one(conn, noop.id, uuid.uuid4(), {"stale": True})
    step("completed (and a stale finish fenced)", 0, 2)
    with transaction(bare_stack.worker_db) as conn:
        assert store.fail_attempt(conn, sleeps[0].id, sleeps[0].lease_token, InternalJobError(),
                                  retry_in=60) == "queued"
    step("a failed attempt queued again", 0, 2)
    with bare_stack.app_db.begin() as conn:
        jobs = Jobs(conn.engine)
        assert jobs.cancel(conn, jobs.member(conn, org, anna.id),
                           sleeps[1].id).status == "cancel_requested"
    step("a running job asked to cancel", 0, 2)
    with transaction(bare_stack.worker_db) as conn:
        assert store.acknowledge_cancel(conn, sleeps[1].id, sleeps[1].lease_token)
    step("the cancel acknowledged", 0, 1)
    with bare_stack.app_db.begin() as conn:
        waiter = Jobs(conn.engine).submit(conn, "bench.noop", {}, organization_id=org,
                                          requested_by=anna.id).job
    step("one more submit", 1, 1)
    with transaction(bare_stack.worker_db) as conn:
        again = store.claim_batch(conn, "counter", limit=1000)
    leased += [job for job in again if job.id != waiter.id]
    held = next(job for job in again if job.id == waiter.id)
    with transaction(bare_stack.worker_db) as conn:
        assert store.wait_job(conn, held.id, held.lease_token, until=None, signal="go",
                              children=None) == "waiting"
    step("a job waiting for a signal: still active", 1, 1)
    with bare_stack.app_db.begin() as conn:
        jobs = Jobs(conn.engine)
        assert jobs.cancel(conn, jobs.member(conn, org, anna.id), waiter.id).status == "cancelled"
    step("a waiting job cancelled", 0, 1)
    others = [(job.id, job.lease_token) for job in leased if job.organization_id != org]
    with transaction(bare_stack.worker_db) as conn:
        store.release_batch(conn, others)
    step("other organizations' leases given back", 0, 1)

    # The owner's ways: an organization deleted with its active jobs, then every job at once.
    assert counted(bare_stack, gone) == 3
    with bare_stack.admin() as conn:
        conn.execute(text("DELETE FROM organizations WHERE id = :o"), {"o": gone})
    assert counted(bare_stack, gone) == 0
    step("another organization deleted with its jobs", 0, 1)
    with bare_stack.admin() as conn:
        conn.execute(text("UPDATE jobs SET status = 'cancelled', finished_at = now()"
                          " WHERE id = :id"), {"id": batch[1].id})
    step("the owner's own update", 0, 0)
    with bare_stack.admin() as conn:
        conn.execute(text("SELECT recount_active_jobs()"))
    step("recounted from the jobs", 0, 0)


def test_writers_of_one_organization_never_wait_on_each_others_count(bare_stack):
    """Each writing transaction adds to rows of its own slot: a submit must not wait for another
    submit of the same organization and kind that has not committed yet."""
    org = bare_stack.org()
    anna = bare_stack.user(org)
    waited, outcome = submit_beside_an_uncommitted_one(bare_stack, org, anna.id, patience=10)
    assert not waited, "the second submit waited for the first one's commit"
    assert type(outcome).__name__ == "Submitted", outcome
    assert counted(bare_stack, org) == active(bare_stack, org) == 2


def test_with_every_slot_held_by_other_writers_a_submit_shares_one_and_counts_exactly(bare_stack):
    """add_active_jobs() updates its transaction's own slot's rows in place; with all 64 slots
    taken by other writers it shares one (pid % 64) through INSERT ... ON CONFLICT, in the order
    of the keys. The count the cap reads stays exact either way."""
    org = bare_stack.org()
    anna = bare_stack.user(org)

    def submit() -> None:
        with bare_stack.app_db.begin() as conn:
            Jobs(conn.engine).submit(conn, "bench.noop", {}, organization_id=org,
                                     requested_by=anna.id)

    with psycopg.connect(libpq_url(bare_stack.admin_url)) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(hashtext('spacejobs.active_job_counts'), s)"
                       " FROM generate_series(0, 63) AS s")
        submit()
        submit()
        assert counted(bare_stack, org) == active(bare_stack, org) == 2
        holder.rollback()
    submit()  # a slot of its own again: its row, if it has one, updated in place
    submit()
    assert counted(bare_stack, org) == active(bare_stack, org) == 4
    assert counts_off(bare_stack) == 0
