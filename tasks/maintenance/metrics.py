"""Metrics: the metric events the jobs trigger records as jobs move (append-only rows, so two
claims never wait on each other's counters) are folded into ``metric_counters``, one bounded
batch a run (fold_metric_events() in models/db/schema/35_operations.sql, FOR UPDATE SKIP
LOCKED). A scrape adds the counters and the events not folded yet, so this chore's cadence
bounds the table, not what ``/metrics`` shows.

A run folds the events after the last one the run before folded, not from the first: behind a
long-open transaction the table keeps every event folded since it began, and a fold from the
first read them all, every run. The first run, and every 60th (``Horizon``), start from the
first event all the same: one whose transaction committed after a later event was folded (or
whose fold by another beat rolled back) is folded then, and is counted by ``/metrics``
meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass

from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.settings import Settings
from spacejobs.tasks.maintenance.chore import Horizon, Report
from spacejobs.tasks.worker_process import WorkerProcess


@dataclass
class MetricsReport(Report):
    #: metric events folded into the counters
    folded: int = 0


class Metrics:
    name = "metrics"
    frequent = False
    #: metric events one run folds at most
    batch = 10_000

    def __init__(self, interval: float) -> None:
        self.interval = interval
        #: the last event id folded, after which the next run starts
        self.horizon: Horizon[int] = Horizon()

    @classmethod
    def from_settings(cls, settings: Settings) -> Metrics:
        return cls(settings.maintenance_interval(cls.name))

    def run(self, process: WorkerProcess) -> MetricsReport:
        with transaction(process.engine, actor="sweeper") as conn:
            folded = store.fold_metrics(conn, batch=self.batch, after=self.horizon.start())
        self.horizon.at = folded.last_id
        return MetricsReport(folded=folded.folded)
