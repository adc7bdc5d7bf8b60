"""Timers: waiting jobs whose moment has come (``ctx.sleep``, ``sleep_until``, a signal's
timeout) go back to the queue within about ``SPACEJOBS_TIMER_INTERVAL`` (0.25 s) of it.

The waits chore resumes timers too, but it reads every waiting job and runs on the sweep's
cadence: too rarely for a timer, and too much to run more often. This chore runs only
resume_due_timers() (models/db/schema/75_waiting.sql: one range of an index, so its cost
follows the timers that are due), several times a second, in every beat: FOR UPDATE SKIP
LOCKED gives each due job to one beat. A timer one run misses is the next run's, or the waits
chore's. Its runs are recorded as beat's (the actor of the job's events), not the sweeper's.
"""

from __future__ import annotations

from dataclasses import dataclass

from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.settings import Settings
from spacejobs.tasks.maintenance.chore import Report, publish_wakeups
from spacejobs.tasks.worker_process import WorkerProcess


@dataclass
class TimersReport(Report):
    #: waiting jobs whose moment had come, queued again
    resumed: int = 0
    wakeups_sent: int = 0
    publish_failures: int = 0


class Timers:
    name = "timers"
    # Several runs a second: added up into beat's next line rather than a line each, and not
    # logged when the broker is down (the publisher logs its failed attempts; the line counts
    # the deferred wake-ups).
    frequent = True
    #: due timers one run resumes at most
    batch = 1000

    def __init__(self, interval: float) -> None:
        self.interval = interval

    @classmethod
    def from_settings(cls, settings: Settings) -> Timers:
        return cls(settings.maintenance_interval(cls.name))

    def run(self, process: WorkerProcess) -> TimersReport:
        with transaction(process.engine, actor="beat") as conn:
            resumed = store.resume_due_timers(conn, batch=self.batch)
        report = TimersReport(resumed=len(resumed))
        report.wakeups_sent, report.publish_failures = publish_wakeups(
            process, [job_id for job_id, _kind in resumed])
        return report
