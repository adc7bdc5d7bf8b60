"""Celery beat that runs the sweep itself, instead of sending it to the workers as a message.

Lost wake-ups and expired leases are recovered only by sweeps, so a sweep must never wait
behind jobs: sent as a message, it waited for a free pool process, and in a 2,000-job chaos run
77 of 140 sweeps expired in their queue while every process drained jobs. Run inside beat, a
sweep needs nothing but beat and PostgreSQL. Several beats on several hosts may all sweep: every
batch of the sweep is taken with FOR UPDATE SKIP LOCKED, so two sweeps never handle one row.
Sweeps run one after another in beat's own loop, so a slow sweep delays the next instead of
overlapping it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.beat import PersistentScheduler, ScheduleEntry

from tasks import sweeper
from tasks.wakeups import SWEEP_TASK, WakeupPublisher

log = logging.getLogger("spacejobs.beat")


class SweepingScheduler(PersistentScheduler):
    _publisher: WakeupPublisher | None = None

    def apply_async(self, entry: ScheduleEntry, producer: Any = None, advance: bool = True,
                    **kwargs: Any) -> Any:
        if entry.task != SWEEP_TASK:
            return super().apply_async(entry, producer=producer, advance=advance, **kwargs)
        entry = self.reserve(entry) if advance else entry
        started = time.monotonic()
        try:
            report = sweeper.sweep_once(publish_wake=self.publisher().wake)
        except Exception:
            # The next sweep tries again; a database outage must not stop beat.
            log.exception("sweep failed")
            return None
        log.info("sweep ran in %.3fs: %s", time.monotonic() - started, report.as_dict())
        return None

    def publisher(self) -> WakeupPublisher:
        if self._publisher is None:
            self._publisher = WakeupPublisher(self.app.conf.broker_url,
                                              self.app.conf.task_default_queue)
        return self._publisher
