"""The orphan sweep of the results store (models/results/sweep.py): stored files no job needs
(older than ``SPACEJOBS_RESULTS_ORPHAN_GRACE``) are deleted, and rows whose file is missing are
reported, both ways without reading a result.

It lists the whole store, so it runs every ``SPACEJOBS_RESULTS_SWEEP_INTERVAL`` (600 s), not on
the sweep's cadence. Safe in several beats at once: deletes are idempotent.
"""

from __future__ import annotations

from dataclasses import dataclass

from spacejobs.models.results.sweep import sweep_orphans
from spacejobs.models.settings import Settings
from spacejobs.tasks.maintenance.chore import Report
from spacejobs.tasks.worker_process import WorkerProcess


@dataclass
class ResultOrphansReport(Report):
    #: objects the store listed
    listed: int = 0
    #: files no job needed, older than the grace period, deleted
    deleted: int = 0
    #: files no job needs yet, still within the grace period
    young: int = 0
    #: objects whose names this code never makes (left alone)
    foreign: int = 0
    #: jobs whose row references a file the store does not have (their ids are logged)
    missing: int = 0


class ResultOrphans:
    name = "result_orphans"
    frequent = False

    def __init__(self, interval: float) -> None:
        self.interval = interval

    @classmethod
    def from_settings(cls, settings: Settings) -> ResultOrphans:
        return cls(settings.maintenance_interval(cls.name))

    def run(self, process: WorkerProcess) -> ResultOrphansReport:
        found = sweep_orphans(process.engine, process.results(),
                              grace=process.settings.results_orphan_grace)
        return ResultOrphansReport(listed=found.listed, deleted=found.deleted, young=found.young,
                                   foreign=found.foreign, missing=len(found.missing))
