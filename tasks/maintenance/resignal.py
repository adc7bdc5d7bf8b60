"""Re-signal: due jobs nobody claimed get a fresh wake-up, which makes a lost wake-up (broker
down at submit, Redis restarted, a message dropped) cost latency, never a job.

A new job is re-signalled once ``SPACEJOBS_WAKEUP_GRACE`` has passed since its submit's own
wake-up; a job put back in the queue (a retry, an expired lease, a release at shutdown) has its
mark cleared, so the next run re-signals it at once. The statement marks the rows before the
wake-ups go out (sweep_unsignalled() in models/db/schema/60_claim_and_lease.sql, FOR UPDATE
SKIP LOCKED), so several beats never re-send the same wake-up, and one whose publish failed is
re-sent a grace period later.
"""

from __future__ import annotations

from dataclasses import dataclass

from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.settings import Settings
from spacejobs.tasks.maintenance.chore import Report, publish_wakeups
from spacejobs.tasks.worker_process import WorkerProcess


@dataclass
class ResignalReport(Report):
    resignalled: int = 0
    #: wake-ups published for them (one per claim batch)
    wakeups_sent: int = 0
    #: jobs whose wake-up was not published (broker down)
    publish_failures: int = 0


class Resignal:
    name = "resignal"
    frequent = False
    #: due jobs one run re-signals at most
    batch = 500

    def __init__(self, interval: float) -> None:
        self.interval = interval

    @classmethod
    def from_settings(cls, settings: Settings) -> Resignal:
        return cls(settings.maintenance_interval(cls.name))

    def run(self, process: WorkerProcess) -> ResignalReport:
        with transaction(process.engine, actor="sweeper") as conn:
            due = store.sweep_unsignalled(conn, grace=process.settings.wakeup_grace,
                                          batch=self.batch)
        report = ResignalReport(resignalled=len(due))
        report.wakeups_sent, report.publish_failures = publish_wakeups(
            process, [job_id for job_id, _kind in due])
        return report
