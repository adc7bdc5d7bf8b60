"""Rescue: jobs whose lease ran out (a worker SIGKILLed, partitioned, frozen) go back to the
queue while they have attempts left, fail with ``lease_expired`` when they have none, and end
``cancelled`` when a cancel was asked for; the ones put back in the queue are woken.

One batch a run, taken with FOR UPDATE SKIP LOCKED (sweep_expired_leases() in
models/db/schema/60_claim_and_lease.sql): several beats never handle the same row, and a job
whose lease still runs is never touched.

A run reads the leases that ran out from the horizon the run before it left on (the earliest
lease then held, a minute back), not from the first lease the index holds: behind a long-open
transaction, the index keeps an entry for the lease of every job finished since it began, and a
walk from its beginning read them all, every run (``Horizon``: the first run, and every 60th,
start from the first lease all the same; the database argues for the horizon,
expired_leases_horizon()).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.jobs.records import Status
from spacejobs.models.settings import Settings
from spacejobs.tasks.maintenance.chore import Horizon, Report, publish_wakeups
from spacejobs.tasks.worker_process import WorkerProcess


@dataclass
class ExpiredLeasesReport(Report):
    requeued: int = 0
    failed: int = 0
    cancelled: int = 0
    #: wake-ups published for the requeued jobs (one per claim batch of them)
    wakeups_sent: int = 0
    #: requeued jobs whose wake-up was not published (broker down)
    publish_failures: int = 0


class ExpiredLeases:
    name = "expired_leases"
    frequent = False
    #: expired leases one run handles at most
    batch = 500
    def __init__(self, interval: float) -> None:
        self.interval = interval
        #: the lease end from which the next run may read
        self.horizon: Horizon[datetime] = Horizon()

    @classmethod
    def from_settings(cls, settings: Settings) -> ExpiredLeases:
        return cls(settings.maintenance_interval(cls.name))

    def run(self, process: WorkerProcess) -> ExpiredLeasesReport:
        from_at = self.horizon.start()
        with transaction(process.engine, actor="sweeper") as conn:
            expired = store.sweep_expired_leases(conn, batch=self.batch, from_at=from_at)
            self.horizon.at = store.expired_leases_horizon(conn, from_at=from_at)
        report = ExpiredLeasesReport()
        requeued = []
        for job_id, status in expired:
            if status == Status.QUEUED:
                report.requeued += 1
                requeued.append(job_id)
            elif status == Status.FAILED:
                report.failed += 1
            else:
                report.cancelled += 1
        report.wakeups_sent, report.publish_failures = publish_wakeups(process, requeued)
        return report
