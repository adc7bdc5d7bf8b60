"""The expired-leases chore (tasks/maintenance/expired_leases.py) against PostgreSQL, as the
worker role: a lease that ran out is put back in the queue (and woken), failed with no attempts
left, or cancelled when a cancel was asked for; a lease that still runs is never touched;
two beats at once take disjoint rows without waiting for each other; and a run reads from the
horizon the run before it left, so that behind a long-open transaction it does not read the
leases of every job finished since, while a lease that runs out after a run is swept by the
next, and one put behind the horizon by hand by the next run from the first lease."""

from __future__ import annotations

import uuid

from sqlalchemy import text

from spacejobs.models.db.transaction import scope, transaction
from spacejobs.models.jobs import store
from spacejobs.tasks.maintenance.expired_leases import ExpiredLeases, ExpiredLeasesReport
from tests.integration.maintenance_kit import (
    Publisher,
    as_beat,
    buffers_read,
    claim,
    drain_queue,
    expire_lease,
    new_job,
    plant_queued,
    report_left_open,
    status_of,
)
from tests.kit.stack import Stack


def test_expired_leases_are_requeued_failed_or_cancelled_and_only_the_requeued_woken(
        bare_stack: Stack):
    stack = bare_stack
    drain_queue(stack)
    retry = new_job(stack, "bench.sleep", params={"seconds": 1})
    last = new_job(stack, "test.stall", params={"seconds": 1})
    cancel = new_job(stack, "bench.sleep", params={"seconds": 1})
    running = new_job(stack, "bench.sleep", params={"seconds": 1})
    leases = {claim(stack).id for _ in range(4)}
    assert leases == {retry.id, last.id, cancel.id, running.id}
    with stack.admin() as conn:
        conn.execute(text("UPDATE jobs SET attempts = max_attempts WHERE id = :id"), {"id": last.id})
    owner = stack.job_row(cancel.id)
    with transaction(stack.app_db, organization_id=owner["organization_id"]) as conn:
        assert store.request_cancel(conn, cancel.id, owner["requested_by"]).status == \
            "cancel_requested"
    for job_id in (retry.id, last.id, cancel.id):
        expire_lease(stack, job_id)

    publisher = Publisher()
    chore = ExpiredLeases(5)
    report = chore.run(as_beat(stack, publisher))
    assert report == ExpiredLeasesReport(requeued=1, failed=1, cancelled=1, wakeups_sent=1)
    assert publisher.woken == [str(retry.id)]
    assert [status_of(stack, j) for j in (retry.id, last.id, cancel.id, running.id)] == [
        "queued", "failed", "cancelled", "leased"]
    assert stack.job_row(last.id)["error_code"] == "lease_expired"
    for job_id in (retry.id, last.id, cancel.id):
        assert stack.events(job_id)[-1]["actor"] == "sweeper"
    assert chore.run(as_beat(stack)) == ExpiredLeasesReport()  # nothing left to do


def test_a_run_takes_one_bounded_batch(bare_stack: Stack):
    stack = bare_stack
    drain_queue(stack)
    jobs = [new_job(stack) for _ in range(3)]
    leases = [claim(stack) for _ in jobs]  # all three first: a claim takes an expired lease too
    for leased in leases:
        expire_lease(stack, leased.id)
    chore = ExpiredLeases(5)
    chore.batch = 2
    assert chore.run(as_beat(stack)).requeued == 2
    assert chore.run(as_beat(stack)).requeued == 1


def test_two_beats_take_disjoint_expired_leases_without_waiting(bare_stack: Stack):
    """Beat may run on several hosts: concurrent runs must neither block nor double-handle."""
    stack = bare_stack
    drain_queue(stack)
    ids = [new_job(stack).id for _ in range(2)]
    for _ in ids:
        claim(stack)
    for job_id in ids:
        expire_lease(stack, job_id)
    with stack.worker_db.connect() as one, stack.worker_db.connect() as two, one.begin(), two.begin():
        two.execute(text("SET LOCAL lock_timeout = '1s'"))
        for conn in (one, two):
            scope(conn, actor="sweeper")
        first = dict(store.sweep_expired_leases(one, batch=1))   # its row stays locked
        second = dict(store.sweep_expired_leases(two, batch=ExpiredLeases.batch))  # the other
    assert len(first) == len(second) == 1
    assert set(first) | set(second) == set(ids)
    assert [e["actor"] for job_id in ids for e in stack.events(job_id)].count("sweeper") == 2


def run_through_with_old_leases(stack: Stack, org: uuid.UUID, user: uuid.UUID, count: int) -> None:
    """``count`` jobs claimed, their leases' ends then put ten minutes back (an entry in
    jobs_lease_expiry_idx each, in the range a sweep reads), and completed."""
    for _ in range(count // 100):
        plant_queued(stack, org, user, 100)
        with transaction(stack.worker_db, actor="worker:w1") as conn:
            leased = store.claim_batch(conn, "w1", limit=100)
        assert len(leased) == 100
        with stack.admin() as conn:
            conn.execute(text("UPDATE jobs SET lease_until = now() - interval '10 minutes'"
                              " WHERE id = ANY(:ids)"), {"ids": [job.id for job in leased]})
        with transaction(stack.worker_db, actor="worker:w1") as conn:
            done = store.complete_batch(conn, [(job.id, job.lease_token, {}, None)
                                               for job in leased])
        assert len(done) == 100


def test_behind_a_held_transaction_a_sweep_from_the_horizon_reads_no_finished_jobs_leases(
        bare_stack: Stack):
    stack = bare_stack
    drain_queue(stack)
    org = stack.org()
    user = stack.user(org, role="owner").id
    with report_left_open(stack):
        run_through_with_old_leases(stack, org, user, 2000)
        with transaction(stack.worker_db, actor="sweeper") as conn:
            horizon = store.expired_leases_horizon(conn, from_at=None)
        from_first = buffers_read(stack, "SELECT * FROM sweep_expired_leases(500, '-infinity')")
        from_horizon = buffers_read(stack, "SELECT * FROM sweep_expired_leases(500, %s)",
                                    (horizon,))
    # from the first lease, every finished job's lease entry is fetched to learn it is gone
    assert from_first >= 4 * from_horizon, (from_first, from_horizon)


def one_lease(stack: Stack) -> uuid.UUID:
    """The only job of an empty queue, claimed."""
    drain_queue(stack)
    job = new_job(stack)
    assert claim(stack).id == job.id
    return job.id


def test_a_lease_that_runs_out_after_a_run_is_swept_by_the_next_from_its_horizon(
        bare_stack: Stack):
    stack = bare_stack
    job_id = one_lease(stack)
    chore = ExpiredLeases(5)
    assert chore.run(as_beat(stack)) == ExpiredLeasesReport()  # from the first lease
    assert chore.horizon.at is not None
    expire_lease(stack, job_id)  # a second ago: after the horizon
    assert chore.run(as_beat(stack)) == ExpiredLeasesReport(requeued=1, wakeups_sent=1)
    assert status_of(stack, job_id) == "queued"


def test_a_lease_put_behind_the_horizon_is_swept_by_the_next_run_from_the_first_lease(
        bare_stack: Stack):
    stack = bare_stack
    job_id = one_lease(stack)
    chore = ExpiredLeases(5)
    chore.horizon.full_every = 3
    assert chore.run(as_beat(stack)) == ExpiredLeasesReport()  # run 1, from the first lease
    with stack.admin() as conn:  # nothing in the code moves a lease's end back; a hand may
        conn.execute(text("UPDATE jobs SET lease_until = now() - interval '2 hours'"
                          " WHERE id = :id"), {"id": job_id})
    assert chore.run(as_beat(stack)) == ExpiredLeasesReport()  # runs 2 and 3: from the horizon
    assert chore.run(as_beat(stack)) == ExpiredLeasesReport()
    assert chore.run(as_beat(stack)).requeued == 1  # run 4: from the first lease again
    assert status_of(stack, job_id) == "queued"
