"""The retention chore (tasks/maintenance/retention.py) against PostgreSQL and a results store:
only what is past the database's policy goes (finished jobs with their events, results, the
audit log), the stored files of what went are deleted after the purge commits, and a beat runs
the chore by itself. (The policy's own rules and the purge functions' refusals are
tests/integration/test_retention.py's.)"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from spacejobs.models.ops import retention
from spacejobs.models.results.store import new_key
from spacejobs.tasks.maintenance.retention import Retention, RetentionReport
from tests.integration.maintenance_kit import as_beat, buffers_read, report_left_open
from tests.kit.stack import Stack
from tests.kit.waiting import wait_until

DEFAULT_POLICY = retention.RetentionPolicy(jobs_days=30, results_days=7, events_days=30,
                                           audit_days=365)


@pytest.fixture(autouse=True)
def default_policy(bare_stack: Stack) -> Iterator[None]:
    """Each test starts from, and leaves, the policy a new database has."""
    yield
    bare_stack.set_retention(**vars(DEFAULT_POLICY))


def finished(stack: Stack, org: uuid.UUID, user: uuid.UUID, *, status: str, days: float,
             stored: bool = False) -> uuid.UUID:
    """A job that finished (or was created, if active) ``days`` ago, inserted as the owner;
    ``stored``: with a result in the results store."""
    job_id = uuid.uuid4()
    ref = new_key(org, job_id) if stored else None
    if ref is not None:
        stack.results().put(ref, b"a result", content_type="text/plain")
    with stack.admin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (id, organization_id, requested_by, kind, status, lease_seconds,"
            " max_attempts, attempts, result, result_ref, created_at, finished_at)"
            " VALUES (:id, :org, :user, 'bench.noop', :status, 30, 3, 1,"
            " CAST(:result AS jsonb), CAST(:ref AS text),"
            " now() - :age * interval '1 day',"
            " CASE WHEN :status IN ('completed', 'failed', 'cancelled')"
            "      THEN now() - :age * interval '1 day' END)"),
            {"id": job_id, "org": org, "user": user, "status": status, "age": days, "ref": ref,
             "result": '{"stored": true}' if stored else None})
    return job_id


def row(stack: Stack, job_id: uuid.UUID) -> dict | None:
    with stack.admin() as conn:
        found = conn.execute(text("SELECT status, result_ref, result_expired_at FROM jobs"
                                  " WHERE id = :id"), {"id": job_id}).mappings().first()
    return dict(found) if found else None


def files(stack: Stack) -> set[str]:
    return {found.key for found in stack.results().list()}


def audit_ages(stack: Stack, org: uuid.UUID) -> list[int]:
    with stack.admin() as conn:
        return list(conn.execute(text(
            "SELECT extract(day FROM now() - at)::int FROM org_audit"
            " WHERE organization_id = :org ORDER BY at"), {"org": org}).scalars())


def test_only_what_is_past_the_policy_goes_and_the_files_it_held_with_it(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    user = stack.user(org).id
    gone = finished(stack, org, user, status="completed", days=40, stored=True)
    failed = finished(stack, org, user, status="failed", days=40)
    dropped = finished(stack, org, user, status="completed", days=8, stored=True)
    young = finished(stack, org, user, status="completed", days=2, stored=True)
    active = finished(stack, org, user, status="queued", days=400)
    with stack.admin() as conn:
        conn.execute(text(
            "INSERT INTO org_audit (organization_id, actor, action, detail, at)"
            " SELECT :org, 'cli', 'organization.state_change', '{}', now() - d * interval '1 day'"
            " FROM unnest(ARRAY[400, 300]) AS d"), {"org": org})
    gone_ref, dropped_ref, young_ref = (row(stack, j)["result_ref"] for j in (gone, dropped, young))

    report = Retention(5).run(as_beat(stack))

    assert (report.jobs_deleted, report.results_dropped, report.files_deleted,
            report.audit_deleted) == (2, 1, 2, 1)
    assert report.batches == 1
    assert row(stack, gone) is None and row(stack, failed) is None
    assert stack.events(gone) == []
    assert row(stack, dropped)["result_ref"] is None
    assert row(stack, dropped)["result_expired_at"] is not None
    assert row(stack, young)["result_ref"] == young_ref
    assert row(stack, active)["status"] == "queued" and stack.events(active)
    assert young_ref in files(stack) and not {gone_ref, dropped_ref} & files(stack)
    assert 300 in audit_ages(stack, org) and 400 not in audit_ages(stack, org)
    # Caught up: the next run finds nothing.
    assert Retention(5).run(as_beat(stack)) == RetentionReport(batches=1)


def test_a_run_takes_batches_back_to_back_while_they_come_back_full(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    user = stack.user(org).id
    for _ in range(5):
        finished(stack, org, user, status="completed", days=60)
    chore = Retention(5)
    chore.batch = 2
    report = chore.run(as_beat(stack))
    assert report.jobs_deleted == 5 and report.batches == 3


def test_a_beat_purges_old_audit_entries_by_itself(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    with stack.admin() as conn:
        conn.execute(text("INSERT INTO org_audit (organization_id, actor, action, at)"
                          " VALUES (:org, 'cli', 'member.remove', now() - interval '2 days')"),
                     {"org": org})
    stack.set_retention(audit_days=1)
    beat = stack.start_beat()
    try:
        wait_until(lambda: audit_ages(stack, org) == [], 30, "the old audit entries purged")
        # The chore commits, then beat logs its counts: wait for the line rather than race it.
        beat.wait_for_log("'audit_deleted': ", timeout=15)
    finally:
        stack.retire(beat)
    assert "chore retention failed" not in beat.output()


def old_finished_jobs(stack: Stack, org: uuid.UUID, user: uuid.UUID, count: int) -> None:
    """``count`` jobs that finished 40 days ago (a second apart), inserted as the owner."""
    with stack.admin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (organization_id, requested_by, kind, status, lease_seconds,"
            " max_attempts, attempts, result, created_at, finished_at)"
            " SELECT :org, :user, 'bench.noop', 'completed', 30, 3, 1, '{}',"
            "        now() - interval '40 days' - i * interval '1 second',"
            "        now() - interval '40 days' - i * interval '1 second'"
            " FROM generate_series(1, :count) AS i"), {"org": org, "user": user, "count": count})


def test_behind_a_held_transaction_a_purge_from_its_horizons_reads_no_purged_jobs(
        bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    user = stack.user(org).id
    chore = Retention(5)
    with report_left_open(stack):
        old_finished_jobs(stack, org, user, 2000)
        assert chore.run(as_beat(stack)).jobs_deleted >= 2000
        horizons = chore.horizon.at
        assert horizons is not None
        from_first = buffers_read(stack, "SELECT * FROM purge_finished_jobs(500, NULL, NULL, NULL)")
        from_horizons = buffers_read(
            stack, "SELECT * FROM purge_finished_jobs(500, %s, %s, %s)",
            (horizons.jobs, horizons.results, horizons.events))
    # from the first job, each step fetches every purged job's entry to learn it is gone
    assert from_first >= 5 * from_horizons, (from_first, from_horizons)


def test_a_job_finished_after_a_run_is_purged_by_the_next_from_its_horizons(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    user = stack.user(org).id
    stack.set_retention(jobs_days=1 / 86400)  # a second
    chore = Retention(5)
    chore.run(as_beat(stack))  # from the first job
    job = finished(stack, org, user, status="completed", days=0)
    time.sleep(1.2)
    assert chore.run(as_beat(stack)).jobs_deleted == 1
    assert row(stack, job) is None


def test_a_job_put_behind_the_horizons_is_purged_by_the_next_run_from_the_first_job(
        bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    user = stack.user(org).id
    chore = Retention(5)
    chore.run(as_beat(stack))
    # finished 40 days ago, but written after the run: as a finish committed late would be
    job = finished(stack, org, user, status="completed", days=40)
    assert chore.run(as_beat(stack)).jobs_deleted == 0
    assert row(stack, job) is not None
    chore.horizon.runs = 0  # the next run starts from the first job
    assert chore.run(as_beat(stack)).jobs_deleted == 1
    assert row(stack, job) is None
