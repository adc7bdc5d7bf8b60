"""Celery beat that runs the sweep itself, and submits the periodic jobs.

Lost wake-ups and expired leases are recovered only by sweeps, so a sweep must never wait
behind jobs: sent as a message, it waited for a free pool process, and in a 2,000-job chaos run
77 of 140 sweeps expired in their queue while every process drained jobs. Run inside beat, a
sweep needs nothing but beat and PostgreSQL. Several beats on several hosts may all sweep: every
batch of the sweep is taken with FOR UPDATE SKIP LOCKED, so two sweeps never handle one row.
Sweeps run one after another in beat's own loop, so a slow sweep delays the next instead of
overlapping it.

Between sweeps the same loop runs the rounds of due timers (tasks/timer_rounds.py), every
SPACEJOBS_TIMER_INTERVAL: a sleeping job goes back to the queue within a fraction of a second of
its moment, without running the whole sweep that often.

Periodic jobs (models/jobs/periodic.py) are submitted from the same loop, at most once per
period by this beat; the period's Idempotency-Key makes it once per period across all beats.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from celery.beat import PersistentScheduler, ScheduleEntry
from pydantic import TypeAdapter

from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import periodic
from spacejobs.models.kinds import load_kinds
from spacejobs.models.settings import get_settings
from spacejobs.tasks import sweeper, worker_process
from spacejobs.tasks.timer_rounds import TimerRounds
from spacejobs.tasks.wakeups import SWEEP_TASK

log = logging.getLogger("spacejobs.beat")


class SweepingScheduler(PersistentScheduler):
    _periodic: list[periodic.Periodic] | None = None
    _submitted: dict[str, datetime]
    _timers: TimerRounds | None = None

    def setup_schedule(self) -> None:
        super().setup_schedule()
        load_kinds()
        entries = TypeAdapter(list[periodic.PeriodicEntry]).validate_json(
            get_settings().periodic_jobs)
        self._periodic = periodic.resolve(entries)  # a bad entry stops beat at once, loudly
        self._submitted = {}
        self._timers = TimerRounds(get_settings().timer_interval)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        self.submit_periodic(datetime.now(UTC))
        if self._timers is None:
            return super().tick(*args, **kwargs)
        self._timers.run_if_due(lambda: sweeper.resume_timers(worker_process.current()))
        # Beat sleeps what tick() returns: until the next sweep, or the next round of timers.
        return min(super().tick(*args, **kwargs), self._timers.seconds_left())

    def submit_periodic(self, now: datetime) -> None:
        for job in self._periodic or ():
            period = job.schedule.period(now)
            if self._submitted.get(job.entry.name) == period:
                continue
            try:
                process = worker_process.current()
                with transaction(process.engine, actor="beat") as conn:
                    submitted = periodic.submit_period(process.jobs, conn, job, period)
            except Exception:
                log.exception("periodic job %s not submitted; the next tick tries again",
                              job.entry.name)
                continue
            self._submitted[job.entry.name] = period
            log.info("periodic job %s for %s: %s", job.entry.name, period.isoformat(),
                     "submitted" if submitted.created else "already submitted by another beat",
                     extra={"job_id": str(submitted.job.id), "kind": job.entry.kind})

    def apply_async(self, entry: ScheduleEntry, producer: Any = None, advance: bool = True,
                    **kwargs: Any) -> Any:
        if entry.task != SWEEP_TASK:
            return super().apply_async(entry, producer=producer, advance=advance, **kwargs)
        # celery-types has reserve() return an event_t; Celery's returns the next ScheduleEntry.
        entry = self.reserve(entry) if advance else entry  # type: ignore[assignment]
        started = time.monotonic()
        try:
            report = sweeper.sweep_once(worker_process.current())
        except Exception:
            # The next sweep tries again; a database outage must not stop beat.
            log.exception("sweep failed")
            return None
        rounds, timers = self._timers.take_totals() if self._timers else (0, sweeper.TimersReport())
        log.info("sweep ran in %.3fs: %s; timers since the last sweep: %d rounds, %s",
                 time.monotonic() - started, report.as_dict(), rounds, asdict(timers))
        return None
