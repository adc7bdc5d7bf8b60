"""The sweeper, run by Celery beat (and safe on many hosts at once: every batch is taken with
FOR UPDATE SKIP LOCKED, so two sweepers never handle the same row)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from uuid import UUID

from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.jobs.records import Status
from spacejobs.models.results.attempt import delete_quietly
from spacejobs.models.results.sweep import sweep_orphans
from spacejobs.models.tenancy import audit
from spacejobs.tasks.worker_process import WorkerProcess

log = logging.getLogger("spacejobs.sweeper")

#: retention batches one sweep runs back to back while each comes back full. One batch a sweep
#: (500 rows every 5 s) purged 100 finished jobs a second: a steady load above that grew the
#: tables without bound (bench.soak at 200 jobs/s). Ten keep up with 1,000 a second and bound
#: the sweep's extra time when a backlog of history is first purged.
PURGE_ROUNDS = 10


@dataclass
class SweepReport:
    requeued: int = 0
    failed: int = 0
    cancelled: int = 0
    resignalled: int = 0
    #: waiting jobs whose moment had come (or whose children's end was missed), queued again
    resumed: int = 0
    #: wake-ups published for the requeued and re-signalled jobs (one per claim batch of them)
    wakeups_sent: int = 0
    #: jobs whose wake-up was not published (broker down)
    publish_failures: int = 0
    jobs_deleted: int = 0
    results_dropped: int = 0
    events_deleted: int = 0
    #: stored files deleted with their jobs or results (retention)
    files_deleted: int = 0
    #: the orphan sweep, when this sweep ran it: files deleted, rows whose file is missing
    orphans_deleted: int = 0
    results_missing: int = 0
    audit_deleted: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def sweep_once(process: WorkerProcess, *, batch: int = 500) -> SweepReport:
    """One sweep, as this process (its engine, its publisher, its results store)."""
    engine = process.engine
    report = SweepReport()
    with transaction(engine, actor="sweeper") as conn:
        expired = store.sweep_expired_leases(conn, batch=batch)
    to_wake = []
    for job_id, status in expired:
        if status == Status.QUEUED:
            report.requeued += 1
            to_wake.append(job_id)
        elif status == Status.FAILED:
            report.failed += 1
        else:
            report.cancelled += 1
    with transaction(engine, actor="sweeper") as conn:
        resumed = store.resume_due_waits(conn, batch=batch)
    report.resumed = len(resumed)
    to_wake.extend(job_id for job_id, _kind in resumed)
    with transaction(engine, actor="sweeper") as conn:
        due = store.sweep_unsignalled(conn, grace=process.settings.wakeup_grace, batch=batch)
    report.resignalled = len(due)
    to_wake.extend(job_id for job_id, _kind in due)
    report.wakeups_sent, report.publish_failures = publish_wakeups(process, to_wake)
    if report.publish_failures:
        log.warning("sweep: broker unreachable, wake-ups for %d jobs deferred",
                    report.publish_failures)
    for _ in range(PURGE_ROUNDS):
        # One short transaction a batch: a purge that held one open across its batches would
        # itself be the long transaction that keeps vacuum from the rows it deletes.
        with transaction(engine, actor="sweeper") as conn:
            # The ages are the database's retention policy: the sweeper only bounds the batch.
            purged = store.purge_finished(conn, batch=batch)
            audit_deleted = audit.purge(conn, batch=batch)
        report.jobs_deleted += purged["jobs_deleted"]
        report.results_dropped += purged["results_dropped"]
        report.events_deleted += purged["events_deleted"]
        report.audit_deleted += audit_deleted
        # Committed: the rows no longer name these files. A delete that fails here leaves the
        # file to the orphan sweep.
        for ref in purged["dropped_refs"]:
            report.files_deleted += delete_quietly(process.results(), ref, {"sweep": "retention"})
        if max(purged["jobs_deleted"], purged["results_dropped"], purged["events_deleted"],
               audit_deleted) < batch:
            break  # caught up: what is left is younger than the policy's ages
    with transaction(engine, actor="sweeper") as conn:
        store.fold_metrics(conn)
    if orphan_sweep_due(process):
        orphans = sweep_orphans(engine, process.results(),
                                grace=process.settings.results_orphan_grace)
        report.orphans_deleted, report.results_missing = orphans.deleted, len(orphans.missing)
    return report


@dataclass
class TimersReport:
    #: waiting jobs whose moment had come, queued again
    resumed: int = 0
    wakeups_sent: int = 0
    publish_failures: int = 0


def resume_timers(process: WorkerProcess, *, batch: int = 1000) -> TimersReport:
    """Due timers only (beat's short cadence, between the sweeps): one indexed statement, and
    the wake-ups for what it resumed. A timer one round misses is the next round's, or the
    sweep's: resume_due_waits() covers the timers too."""
    with transaction(process.engine, actor="beat") as conn:
        resumed = store.resume_due_timers(conn, batch=batch)
    report = TimersReport(resumed=len(resumed))
    # Not logged here, several times a second while Redis is down: the publisher logs each
    # failed attempt, and beat's line per sweep adds up the rounds' deferred wake-ups.
    report.wakeups_sent, report.publish_failures = publish_wakeups(
        process, [job_id for job_id, _kind in resumed])
    return report


def publish_wakeups(process: WorkerProcess, job_ids: Sequence[UUID]) -> tuple[int, int]:
    """Wake-ups for due jobs: (published, jobs left unwoken because the broker is down)."""
    # One wake-up per claim batch of due jobs, not one per job: a woken process claims up to a
    # batch at once, drains until nothing is due and wakes another process when more is due
    # than it took, so more messages would only be pool processes finding the queue empty.
    # (The chaos run once left 29,061 wake-ups in Redis after a backlog, one per job.)
    per_wakeup = process.settings.claim_batch
    sent = 0
    for first in range(0, len(job_ids), per_wakeup):
        if not process.publisher.wake(str(job_ids[first]), force=True):
            # The broker is down: stop trying for this round. The rows are queued and the
            # next sweep after the grace period re-sends their wake-ups.
            return sent, len(job_ids) - first
        sent += 1
    return sent, 0


def orphan_sweep_due(process: WorkerProcess) -> bool:
    """Once every SPACEJOBS_RESULTS_SWEEP_INTERVAL seconds per process (it lists the store)."""
    now = time.monotonic()
    last = process.last_orphan_sweep
    if last is not None and now - last < process.settings.results_sweep_interval:
        return False
    process.last_orphan_sweep = now
    return True
