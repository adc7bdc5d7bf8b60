"""Celery beat that runs the maintenance chores itself (tasks/maintenance/), each on its own
cadence: the periodic jobs, the timers, expired leases, waits, re-signals, retention, metrics
and the orphan sweep of the results store.

Lost wake-ups and expired leases are recovered only by these chores, so they must never wait
behind jobs: sent to the workers as a message, a sweep waited for a free pool process, and in
a 2,000-job chaos run 77 of 140 sweeps expired in their queue while every process drained jobs.
Run inside beat, a chore needs nothing but beat and PostgreSQL. Several beats on several hosts
may all run them: every batch is taken with FOR UPDATE SKIP LOCKED, so two beats never handle
one row. The chores run one after another in beat's own loop (tasks/maintenance/schedule.py),
so a slow one delays the next instead of overlapping it, and one that fails is logged and
retried at its next run while the others go on.

Entries of Celery's own beat_schedule, if a deployment adds any, are sent as usual.
"""

from __future__ import annotations

from typing import Any

from celery.beat import PersistentScheduler

from spacejobs.models.kinds import load_kinds
from spacejobs.models.settings import get_settings
from spacejobs.tasks import maintenance, worker_process
from spacejobs.tasks.maintenance.schedule import Maintenance


class MaintenanceScheduler(PersistentScheduler):
    _maintenance: Maintenance | None = None

    def setup_schedule(self) -> None:
        super().setup_schedule()
        load_kinds()
        # A bad periodic job's entry raises here: beat stops at once, loudly.
        self._maintenance = Maintenance(maintenance.chores(get_settings()),
                                        worker_process.current)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if self._maintenance is None:
            return super().tick(*args, **kwargs)
        self._maintenance.run_due()
        # Beat sleeps what tick() returns: until the next chore (or entry) is due.
        return min(super().tick(*args, **kwargs), self._maintenance.seconds_left())


#: the name celeryconfig.py gave it before the chores had cadences of their own
SweepingScheduler = MaintenanceScheduler
