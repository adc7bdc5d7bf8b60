"""The resignal chore (tasks/maintenance/resignal.py) against PostgreSQL: a job due and never
signalled gets one wake-up once its grace has passed, and not again within the next; a job put
back in the queue gets one at the next run, its grace waived; a beat whose only quick chore
is this one re-sends a lost wake-up on its own cadence, while the other chores keep theirs;
and behind a long-open transaction the sweep reads as many buffers after thousands of jobs went
through the queue as before (it reads each key from its claim head, as the claim does)."""

from __future__ import annotations

from spacejobs.models.db.transaction import transaction
from spacejobs.models.errors import InternalJobError
from spacejobs.models.jobs import store
from spacejobs.tasks.maintenance.claim_heads import ClaimHeads
from spacejobs.tasks.maintenance.expired_leases import ExpiredLeases
from spacejobs.tasks.maintenance.resignal import Resignal, ResignalReport
from tests.conftest import submit
from tests.integration.leasing import release_one
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
    run_through,
)
from tests.kit.stack import Stack

UNREACHABLE_BROKER = "redis://127.0.0.1:1/0"


def test_a_due_job_never_signalled_gets_one_wakeup_once_its_grace_has_passed(bare_stack: Stack):
    stack = bare_stack
    drain_queue(stack)
    job = new_job(stack)
    chore = Resignal(5)
    assert chore.run(as_beat(stack, wakeup_grace=60)) == ResignalReport()  # still within grace
    publisher = Publisher()
    report = chore.run(as_beat(stack, publisher, wakeup_grace=0))
    assert report == ResignalReport(resignalled=1, wakeups_sent=1)
    assert publisher.woken == [str(job.id)]
    # Just re-signalled: not again within the grace.
    assert chore.run(as_beat(stack, wakeup_grace=1)) == ResignalReport()


def test_jobs_put_back_in_the_queue_are_resignalled_without_waiting_for_the_grace(
        bare_stack: Stack):
    """A retry, an expired lease and a release at shutdown each clear last_wakeup_at: if their
    own wake-up is lost they are re-signalled at the next run, not a grace period later."""
    stack = bare_stack
    drain_queue(stack)
    ids = [new_job(stack).id for _ in range(3)]
    leases = {job.id: job for job in (claim(stack) for _ in range(3))}
    retried, expired, released = (leases[i] for i in ids)
    with transaction(stack.worker_db) as conn:
        assert store.fail_attempt(conn, retried.id, retried.lease_token, InternalJobError(),
                                  retry_in=0) == "queued"
        assert release_one(conn, released.id, released.lease_token)
    expire_lease(stack, expired.id)
    assert ExpiredLeases(5).run(as_beat(stack)).requeued == 1

    publisher = Publisher()
    report = Resignal(5).run(as_beat(stack, publisher, wakeup_grace=60))
    assert report.resignalled == 3 and report.wakeups_sent == 1  # one claim batch
    new_job(stack)
    # A new job waits for its own wake-up, the grace.
    assert Resignal(5).run(as_beat(stack, wakeup_grace=60)) == ResignalReport()


def test_a_beat_re_sends_a_lost_wakeup_on_the_resignal_chores_own_cadence(bare_stack: Stack):
    stack = bare_stack
    drain_queue(stack)
    # No lingering (LISTEN), no idle claim by the floor: only a wake-up may start the job.
    worker = stack.start_worker(concurrency=1, SPACEJOBS_LINGER_SECONDS="0",
                                SPACEJOBS_FLOOR_IDLE_POLL="0")
    # The sweep's chores once an hour (after the first run at beat's start), re-signals apart.
    beat = stack.start_beat(SPACEJOBS_SWEEP_INTERVAL="3600",
                            SPACEJOBS_MAINTENANCE_RESIGNAL_INTERVAL="0.5")
    try:
        org = stack.org()
        anna = stack.user(org, role="owner")
        lost = submit(stack.make_app(BROKER_URL=UNREACHABLE_BROKER).test_client(), org, anna,
                      "bench.noop")
        done = stack.wait_for(lost["id"], "completed", timeout=30)
        assert done["last_wakeup_at"] > done["created_at"]  # the resignal chore's wake-up
        lines = [line for line in beat.output().splitlines() if "maintenance ran in" in line]
        assert "retention {" in lines[0]  # beat's start: every chore once
        assert len(lines) > 1 and not any("retention {" in line for line in lines[1:])
        assert all("resignal {" in line for line in lines[1:])
    finally:
        stack.retire(worker, beat)


def test_a_job_given_back_behind_a_head_that_moved_on_is_resignalled(bare_stack: Stack):
    """The sweep reads each key from its claim head: a job put back in the queue behind a head
    the chore moved past it must still be found (the jobs triggers move the head back)."""
    stack = bare_stack
    drain_queue(stack)
    org = stack.org()
    user = stack.user(org, role="owner").id
    plant_queued(stack, org, user, 1)
    held = claim(stack)
    run_through(stack, org, user, 200)
    ClaimHeads(interval=1, lag=0).run(as_beat(stack))  # the head passes the held job's place
    with transaction(stack.worker_db) as conn:
        assert release_one(conn, held.id, held.lease_token)
    publisher = Publisher()
    report = Resignal(5).run(as_beat(stack, publisher, wakeup_grace=60))
    assert report == ResignalReport(resignalled=1, wakeups_sent=1)
    assert publisher.woken == [str(held.id)]


def test_behind_a_held_transaction_the_resignal_sweep_reads_no_finished_jobs(bare_stack: Stack):
    stack = bare_stack
    drain_queue(stack)
    org = stack.org()
    user = stack.user(org, role="owner").id

    def sweep_buffers() -> int:
        plant_queued(stack, org, user, 5)  # due, and its wake-up within no grace
        ClaimHeads(interval=1, lag=0).run(as_beat(stack))
        read = buffers_read(stack, "SELECT * FROM sweep_unsignalled(0, 500)")
        drain_queue(stack)
        return read

    with report_left_open(stack):
        run_through(stack, org, user, 1000)
        first = sweep_buffers()
        run_through(stack, org, user, 3000)
        after = sweep_buffers()
    # from jobs_claimable_idx's beginning it read every one of the 3,000 jobs' queued entries
    assert after <= first + 50, (first, after)
