"""The job store's transitions, against the real schema, as the real roles (no worker processes)."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from spacejobs.demo.projects import Projects
from spacejobs.models.db.migrate import schema_files
from spacejobs.models.db.transaction import transaction
from spacejobs.models.errors import JobFinished, LeaseLost, NotFound
from spacejobs.models.jobs import store
from spacejobs.models.jobs.records import Job
from spacejobs.models.kinds import get_kind, load_kinds
from spacejobs.tasks.engine.context import JobContext
from spacejobs.tasks.engine.leases import WorkerLeases
from tests.integration.leasing import claim_one, complete_one
from tests.kit.stack import Stack

load_kinds()


@pytest.fixture(scope="module")
def stack_db(bare_stack: Stack) -> Stack:
    return bare_stack


def new_job(stack: Stack, kind: str = "bench.noop", **kw) -> tuple[uuid.UUID, Job]:
    org = kw.pop("org", None) or stack.org()
    user = stack.user(org, role="owner")
    with transaction(stack.app_db, organization_id=org, user_id=user.id, actor="test") as conn:
        job, created = store.submit(conn, [store.NewJob(get_kind(kind).rules, kw.pop("params", {}), **kw)],
                                    organization_id=org, requested_by=user.id)[0]
    assert created == "created"
    return org, job


def claim(stack: Stack, worker: str = "w1"):
    with transaction(stack.worker_db, actor=f"worker:{worker}") as conn:
        return claim_one(conn, worker)


def expire_lease(stack: Stack, job_id) -> None:
    """The lease runs out and beat's sweeper puts the job back in the queue, where the next
    claim takes it (the claim itself leaves expired leases to the sweeper)."""
    # Test set-up through the owner role: make the lease run out without waiting for it.
    with stack.admin() as conn:
        conn.execute(text("UPDATE jobs SET lease_until = now() - interval '1 second' WHERE id = :id"),
                     {"id": job_id})
    with transaction(stack.worker_db, actor="sweeper") as conn:
        assert (job_id, "queued") in store.sweep_expired_leases(conn, batch=100)


def drain_queue(stack: Stack) -> None:
    while (leased := claim(stack)) is not None:
        with transaction(stack.worker_db) as conn:
            complete_one(conn, leased.id, leased.lease_token, {})


def test_late_finish_with_stale_token_changes_nothing(stack_db: Stack):
    drain_queue(stack_db)
    _, job = new_job(stack_db)
    first = claim(stack_db, "w1")
    assert first.id == job.id and first.attempt == 1
    expire_lease(stack_db, job.id)
    second = claim(stack_db, "w2")
    assert second.id == job.id and second.attempt == 2
    assert second.lease_token != first.lease_token

    with transaction(stack_db.worker_db) as conn:
        assert complete_one(conn, job.id, second.lease_token, {"by": "second"})
    with transaction(stack_db.worker_db) as conn:
        assert not complete_one(conn, job.id, first.lease_token, {"by": "first"})
        assert store.fail_attempt(conn, job.id, first.lease_token, JobFinished(), retry_in=0) is None

    row = stack_db.job_row(job.id)
    assert (row["status"], row["result"], row["lease_token"]) == ("completed", {"by": "second"}, None)
    assert [(e["to_status"], e["attempt"]) for e in stack_db.events(job.id)] == [
        ("queued", 0), ("leased", 1), ("queued", 1), ("leased", 2), ("completed", 2)]


def test_a_stale_row_in_a_batch_finish_is_discarded_and_the_others_commit(stack_db: Stack):
    drain_queue(stack_db)
    org, first = new_job(stack_db)
    jobs = [first] + [new_job(stack_db, org=org)[1] for _ in range(2)]
    with transaction(stack_db.worker_db, actor="worker:w1") as conn:
        batch = store.claim_batch(conn, "w1", limit=3)
    assert sorted(j.id for j in batch) == sorted(j.id for j in jobs)
    tokens = {j.id: j.lease_token for j in batch}
    assert len(set(tokens.values())) == 3  # each row of the batch has its own token
    stale = jobs[1].id
    expire_lease(stack_db, stale)
    taken_over = claim(stack_db, "w2")
    assert taken_over.id == stale and taken_over.lease_token != tokens[stale]

    with transaction(stack_db.worker_db, actor="worker:w1") as conn:
        won = store.complete_batch(conn, [(job_id, token, {"by": "w1"}, None)
                                          for job_id, token in tokens.items()])
    assert won == {jobs[0].id, jobs[2].id}
    for job in (jobs[0], jobs[2]):
        assert stack_db.job_row(job.id)["status"] == "completed"
    row = stack_db.job_row(stale)
    assert (row["status"], row["lease_token"], row["result"]) == ("leased", taken_over.lease_token, None)
    assert "completed" not in [e["to_status"] for e in stack_db.events(stale)]


def test_a_batchs_heartbeat_standing_and_release_answer_only_the_leases_still_held(
        stack_db: Stack):
    """Attack, as the worker role: one batch hands back a lease it holds, a lease a newer
    attempt took over (its old token) and a held job under a made-up token. Only the first is
    extended, has its requester's standing read, and is given back; the others stay as they
    were (revision 0063 changed how these statements join the leases to their rows)."""
    drain_queue(stack_db)
    org, first = new_job(stack_db)
    jobs = [first] + [new_job(stack_db, org=org)[1] for _ in range(2)]
    with transaction(stack_db.worker_db, actor="worker:w1") as conn:
        batch = {j.id: j.lease_token for j in store.claim_batch(conn, "w1", limit=3)}
    held, stale, forged = (job.id for job in jobs)
    expire_lease(stack_db, stale)
    taken_over = claim(stack_db, "w2")
    assert taken_over.id == stale
    leases = [(held, batch[held]), (stale, batch[stale]), (forged, uuid.uuid4())]
    with transaction(stack_db.worker_db, actor="worker:w1") as conn:
        assert set(store.extend_leases(conn, leases)) == {held}
        assert set(store.lease_standing(conn, leases)) == {held}
    with transaction(stack_db.worker_db, actor="worker:w1") as conn:
        assert store.release_batch(conn, leases) == {held}
    assert stack_db.job_row(held)["status"] == "queued"
    for job_id, token in ((stale, taken_over.lease_token), (forged, batch[forged])):
        row = stack_db.job_row(job_id)
        assert (row["status"], row["lease_token"]) == ("leased", token)


def test_a_live_lease_cannot_be_taken_over_even_with_raw_sql(stack_db: Stack):
    drain_queue(stack_db)
    _, job = new_job(stack_db)
    leased = claim(stack_db)
    takeover = text("UPDATE jobs SET lease_token = gen_random_uuid() WHERE id = :id")
    # The worker role has no UPDATE at all (revision 0039); the trigger refuses any writer,
    # the owner included.
    with pytest.raises(DBAPIError, match="permission denied"), transaction(stack_db.worker_db) as conn:
        conn.execute(takeover, {"id": job.id})
    with pytest.raises(DBAPIError, match="leased until"), stack_db.admin() as conn:
        conn.execute(takeover, {"id": job.id})
    assert stack_db.job_row(job.id)["lease_token"] == leased.lease_token


# (Status changes out of a terminal state and queued -> completed jumps are covered, with the
# row checked unchanged, in test_row_level_security.py.)
def test_a_finished_jobs_result_cannot_be_rewritten(stack_db: Stack):
    drain_queue(stack_db)
    _, job = new_job(stack_db)
    leased = claim(stack_db)
    with transaction(stack_db.worker_db) as conn:
        assert complete_one(conn, job.id, leased.lease_token, {"ok": True})
    rewrite = text("UPDATE jobs SET result = '{\"x\": 1}' WHERE id = :id")
    with pytest.raises(DBAPIError, match="permission denied"), transaction(stack_db.worker_db) as conn:
        conn.execute(rewrite, {"id": job.id})
    with pytest.raises(DBAPIError, match="can no longer change"), stack_db.admin() as conn:
        conn.execute(rewrite, {"id": job.id})
    assert stack_db.job_row(job.id)["result"] == {"ok": True}


def test_concurrent_claims_skip_each_others_rows_without_waiting(stack_db: Stack):
    drain_queue(stack_db)
    org, a = new_job(stack_db)
    _, b = new_job(stack_db, org=org)
    with stack_db.worker_db.connect() as one, stack_db.worker_db.connect() as two, one.begin(), two.begin():
        two.execute(text("SET LOCAL lock_timeout = '1s'"))
        first = claim_one(one, "one")       # row lock held until commit
        second = claim_one(two, "two")      # must skip it, not wait for it
        assert third_is_none(two)
    assert {first.id, second.id} == {a.id, b.id}


def third_is_none(conn) -> bool:
    return claim_one(conn, "two") is None


def test_tenant_writes_of_an_attempt_that_lost_its_lease_roll_back(stack_db: Stack):
    drain_queue(stack_db)
    org, job = new_job(stack_db, "projects_export")
    stale = claim(stack_db)
    expire_lease(stack_db, job.id)
    assert claim(stack_db).id == job.id  # a newer attempt holds it now

    ctx = JobContext(WorkerLeases(stack_db.worker_db, "stale"), stale, get_kind("projects_export").rules)
    with pytest.raises(LeaseLost), ctx.tenant() as tenant:
        Projects.of(tenant).create("written by a stale attempt")
    with transaction(stack_db.worker_db, organization_id=org) as conn:
        assert conn.execute(text("SELECT count(*) FROM projects")).scalar() == 0


def test_cancel_queued_is_immediate_running_is_requested_finished_is_refused(stack_db: Stack):
    drain_queue(stack_db)
    org, queued = new_job(stack_db)
    user = stack_db.job_row(queued.id)["requested_by"]

    def cancel(job_id):
        with transaction(stack_db.app_db, organization_id=org, user_id=user) as conn:
            return store.request_cancel(conn, job_id, user)

    assert cancel(queued.id).status == "cancelled"
    _, running = new_job(stack_db, org=org)
    leased = claim(stack_db)
    assert cancel(running.id).status == "cancel_requested"
    assert cancel(running.id).status == "cancel_requested"  # asking twice changes nothing
    # The job finished before it saw the request: completion wins, and stays.
    with transaction(stack_db.worker_db) as conn:
        assert complete_one(conn, running.id, leased.lease_token, {"done": True})
    with pytest.raises(JobFinished):
        cancel(running.id)
    with pytest.raises(NotFound):
        cancel(uuid.uuid4())
    assert [e["to_status"] for e in stack_db.events(running.id)] == [
        "queued", "leased", "cancel_requested", "completed"]


def test_claim_reads_the_partial_index_however_many_jobs_finished(stack_db: Stack):
    org, _ = new_job(stack_db)
    user = stack_db.job_row(_.id)["requested_by"]
    with stack_db.admin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (organization_id, requested_by, kind, status, lease_seconds,"
            " max_attempts, attempts, finished_at)"
            " SELECT :org, :user, 'bench.noop', 'completed', 30, 3, 1, now()"
            " FROM generate_series(1, 20000)"), {"org": org, "user": user})
        conn.execute(text("ANALYZE jobs"))
    # The claim is claim_jobs()'s one statement: plan it as written in the schema, with values.
    schema = "".join(path.read_text() for path in schema_files())
    body = schema[schema.index("CREATE FUNCTION claim_jobs("):]
    main = body.index("RETURN QUERY\n    WITH open_orgs")
    statement = body[main + len("RETURN QUERY"):body.index(";\n    GET DIAGNOSTICS", main)]
    values = {"p_worker": "'explain'", "p_limit": "50", "p_skip_kinds": "'{}'::text[]",
              "p_only_kind": "NULL::text",
              "p_after_organization": "'00000000-0000-0000-0000-000000000000'::uuid",
              "taken": "0", "p_rate_kinds": "'{}'::text[]", "ring_visit": "1024",
              "(nil,": "('00000000-0000-0000-0000-000000000000'::uuid,"}
    for name, value in values.items():
        statement = statement.replace(name, value)
    # a rate-limited (organization, kind)'s jobs, the first statement of its loop
    limited = body[body.index("RETURN QUERY\n            WITH picked") + len("RETURN QUERY"):]
    limited = limited[:limited.index(";\n")]
    for name, value in {"p_worker": "'explain'", "limited_kind": "'bench.noop'", "room": "5",
                        "= org": f"= '{org}'::uuid"}.items():
        limited = limited.replace(name, value)
    with stack_db.admin() as conn:
        plan = "\n".join(r[0] for r in conn.execute(text("EXPLAIN " + statement)))
        limited_plan = "\n".join(r[0] for r in conn.execute(text("EXPLAIN " + limited)))
        conn.rollback()
    assert "jobs_fair_claim_idx" in plan and "claim_heads_newest_idx" in plan, plan
    assert "jobs_org_running_idx" in plan and "jobs_sequence_idx" in plan, plan
    assert "Seq Scan on jobs" not in plan, plan
    assert "jobs_kind_claim_idx" in limited_plan and "Seq Scan on jobs" not in limited_plan, \
        limited_plan


def test_a_batch_of_transitions_writes_its_metrics_per_kind_and_label(stack_db: Stack):
    """The jobs' update trigger counts a claim's and a finish's metrics per kind and bucket
    (revision 0059): the rows a batch writes are what its jobs' waits and durations say."""
    drain_queue(stack_db)
    org = stack_db.org()
    count_by_kind = {"bench.noop": 3, "bench.sleep": 2}  # all in one claim and one finish
    jobs = {kind: [new_job(stack_db, kind, org=org)[1].id for _ in range(n)]
            for kind, n in count_by_kind.items()}
    with stack_db.admin() as conn:
        # Test set-up through the owner role: each kind's jobs created a known time ago.
        since = conn.execute(text("SELECT coalesce(max(id), 0) FROM metric_events")).scalar_one()
        for kind, ago in (("bench.noop", 3), ("bench.sleep", 40)):
            conn.execute(text("UPDATE jobs SET created_at = now() - make_interval(secs => :ago)"
                              " WHERE id = ANY (:ids)"), {"ago": ago, "ids": jobs[kind]})
    with transaction(stack_db.worker_db, actor="worker:w1") as conn:
        leased = store.claim_batch(conn, "w1", limit=10)
    assert sorted(str(j.id) for j in leased) == sorted(str(i) for ids in jobs.values() for i in ids)
    with stack_db.admin() as conn:
        for kind, ran in (("bench.noop", 1.5), ("bench.sleep", 20)):
            conn.execute(text("UPDATE jobs SET started_at = now() - make_interval(secs => :ran)"
                              " WHERE id = ANY (:ids)"), {"ran": ran, "ids": jobs[kind]})
    with transaction(stack_db.worker_db) as conn:
        done = store.complete_batch(conn, [(j.id, j.lease_token, {}, None) for j in leased])
    assert len(done) == sum(count_by_kind.values())
    with stack_db.admin() as conn:
        rows = conn.execute(text("SELECT name, kind, label, value FROM metric_events WHERE id > :since"
                                 " AND kind IN ('bench.noop', 'bench.sleep')"),
                            {"since": since}).all()
    counted = {(r.name, r.kind, r.label): r.value for r in rows if not r.name.endswith("_sum")}
    assert len(counted) + 4 == len(rows)  # one row per metric, kind and label: the sums below
    assert counted == {
        ("spacejobs_job_queue_wait_seconds_bucket", "bench.noop", "5"): 3,
        ("spacejobs_job_queue_wait_seconds_bucket", "bench.sleep", "60"): 2,
        ("spacejobs_jobs_finished_total", "bench.noop", "completed"): 3,
        ("spacejobs_jobs_finished_total", "bench.sleep", "completed"): 2,
        ("spacejobs_job_duration_seconds_bucket", "bench.noop", "2.5"): 3,
        ("spacejobs_job_duration_seconds_bucket", "bench.sleep", "30"): 2,
    }
    sums = {(r.name, r.kind): r.value for r in rows if r.name.endswith("_sum")}
    assert 9 <= sums[("spacejobs_job_queue_wait_seconds_sum", "bench.noop")] < 9 + 3 * 2
    assert 80 <= sums[("spacejobs_job_queue_wait_seconds_sum", "bench.sleep")] < 80 + 2 * 2
    assert 4.5 <= sums[("spacejobs_job_duration_seconds_sum", "bench.noop")] < 4.5 + 3 * 1
    assert 40 <= sums[("spacejobs_job_duration_seconds_sum", "bench.sleep")] < 40 + 2 * 1

    # A lease that ran out, swept back into the queue: one expiry, counted under its kind.
    _, job = new_job(stack_db, "bench.noop", org=org)
    assert claim(stack_db).id == job.id
    with stack_db.admin() as conn:
        since = conn.execute(text("SELECT coalesce(max(id), 0) FROM metric_events")).scalar_one()
    expire_lease(stack_db, job.id)
    with stack_db.admin() as conn:
        expired = conn.execute(text("SELECT name, kind, label, value FROM metric_events"
                                    " WHERE id > :since"), {"since": since}).all()
    assert [tuple(r) for r in expired] == [("spacejobs_leases_expired_total", "bench.noop", "", 1)]
