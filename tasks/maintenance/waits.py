"""Waits: waiting jobs whose condition came go back to the queue, and are woken.

The floor under the faster paths: a timer's moment is the timers chore's (timers.py, every
``SPACEJOBS_TIMER_INTERVAL``), a parent's children ending is the jobs trigger's, a signal is
its own statement's. This chore's statement covers all of them (resume_due_waits() in
models/db/schema/75_waiting.sql): timers a run of the timers chore missed, and parents whose
last child ended at the very moment they began to wait. It reads every waiting job, so it runs
on the sweep's cadence, not the timers'. One batch a run, FOR UPDATE SKIP LOCKED.
"""

from __future__ import annotations

from dataclasses import dataclass

from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.settings import Settings
from spacejobs.tasks.maintenance.chore import Report, publish_wakeups
from spacejobs.tasks.worker_process import WorkerProcess


@dataclass
class WaitsReport(Report):
    #: waiting jobs whose moment had come (or whose children's end was missed), queued again
    resumed: int = 0
    wakeups_sent: int = 0
    publish_failures: int = 0


class Waits:
    name = "waits"
    frequent = False
    #: waiting jobs one run resumes at most
    batch = 500

    def __init__(self, interval: float) -> None:
        self.interval = interval

    @classmethod
    def from_settings(cls, settings: Settings) -> Waits:
        return cls(settings.maintenance_interval(cls.name))

    def run(self, process: WorkerProcess) -> WaitsReport:
        with transaction(process.engine, actor="sweeper") as conn:
            resumed = store.resume_due_waits(conn, batch=self.batch)
        report = WaitsReport(resumed=len(resumed))
        report.wakeups_sent, report.publish_failures = publish_wakeups(
            process, [job_id for job_id, _kind in resumed])
        return report
