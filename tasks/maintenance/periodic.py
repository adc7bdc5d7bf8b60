"""Periodic jobs (models/jobs/periodic.py): each configured job is submitted once per period of
its schedule.

This beat submits a period's job at most once (it remembers the last period it submitted per
job); the period's Idempotency-Key makes it once across all beats, so a second beat's submit
is a replay, logged as such. Each job on its own: one whose submit fails (the database down, a
requester who is no longer a member) is retried at the next run, and does not keep the others
from being submitted; its failure is logged once with its traceback, then once a minute while
it lasts, and once when it is submitted again.

Checking is cheap (no statement unless a new period has begun), so it runs on the timers'
cadence by default: a job is submitted within a fraction of a second of its period's start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import TypeAdapter

from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import periodic
from spacejobs.models.settings import Settings
from spacejobs.tasks.maintenance.chore import Report
from spacejobs.tasks.maintenance.schedule import Outage
from spacejobs.tasks.worker_process import WorkerProcess

log = logging.getLogger("spacejobs.maintenance")


@dataclass
class PeriodicReport(Report):
    #: period's jobs this beat submitted
    submitted: int = 0
    #: period's jobs another beat had submitted first
    already: int = 0
    #: submits that failed (tried again at the next run)
    failed: int = 0


class Periodic:
    name = "periodic"
    # Several runs a second: added up into beat's line; each submit logs its own line.
    frequent = True

    def __init__(self, interval: float, jobs: Sequence[periodic.Periodic], *,
                 now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.jobs = list(jobs)
        self._now = now
        #: the last period this beat submitted, per job
        self._submitted: dict[str, datetime] = {}
        self._outages = {job.entry.name: Outage(f"periodic job {job.entry.name}", interval,
                                                failed="not submitted", clock=clock)
                         for job in self.jobs}

    @classmethod
    def from_settings(cls, settings: Settings) -> Periodic:
        """The configured jobs, checked now: a bad entry (an unknown kind, invalid params, no
        schedule) raises, and stops beat at its start, loudly. The kinds must be loaded."""
        entries = TypeAdapter(list[periodic.PeriodicEntry]).validate_json(settings.periodic_jobs)
        return cls(settings.maintenance_interval(cls.name), periodic.resolve(entries))

    def run(self, process: WorkerProcess) -> PeriodicReport:
        report = PeriodicReport()
        now = self._now()
        for job in self.jobs:
            name = job.entry.name
            period = job.schedule.period(now)
            if self._submitted.get(name) == period:
                continue
            try:
                with transaction(process.engine, actor="beat") as conn:
                    submitted = periodic.submit_period(process.jobs, conn, job, period)
            except Exception:
                report.failed += 1
                self._outages[name].failed()
                continue
            self._outages[name].succeeded()
            self._submitted[name] = period
            if submitted.created:
                report.submitted += 1
            else:
                report.already += 1
            log.info("periodic job %s for %s: %s", name, period.isoformat(),
                     "submitted" if submitted.created else "already submitted by another beat",
                     extra={"job_id": str(submitted.job.id), "kind": job.entry.kind})
        return report
