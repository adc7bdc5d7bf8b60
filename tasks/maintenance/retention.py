"""Retention: finished jobs (with their events and diagnostics), results, job events and the
organizations' audit log go once past the ages of the database's policy, and the stored files
of the jobs and results that went are deleted.

The ages are the database's (retention_policy, models/ops/retention.py): the chore chooses only
the batch, so worker credentials cannot make history go sooner. Batches run back to back while
they come back full, at most ``PURGE_ROUNDS`` a run, each in its own short transaction (one
held across the batches would itself be the long transaction that keeps vacuum from the rows
it deletes). Rows are taken FOR UPDATE SKIP LOCKED: several beats never purge the same row.

Each step reads from the horizon the batch before it left (purge_finished_jobs(): the policy's
cutoff once it caught up, else the finish time of the last job it took), not from the first
finished job: behind a long-open transaction, the index of finish times keeps an entry for every
job purged since it began, and a walk from its beginning read them all, every batch. The first
run, and every 60th (``Horizon``), start from the first job all the same: a job that finished
before a horizon and committed after the run that left it (or that another beat locked, then
rolled back) is purged then.
"""

from __future__ import annotations

from dataclasses import dataclass

from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.jobs.store import RetentionHorizons
from spacejobs.models.results.attempt import delete_quietly
from spacejobs.models.settings import Settings
from spacejobs.models.tenancy import audit
from spacejobs.tasks.maintenance.chore import Horizon, Report
from spacejobs.tasks.worker_process import WorkerProcess

#: retention batches one run takes back to back while each comes back full. One batch a run
#: (500 rows every 5 s) purged 100 finished jobs a second: a steady load above that grew the
#: tables without bound (bench.soak at 200 jobs/s). Ten keep up with 1,000 a second and bound
#: a run's time when a backlog of history is first purged.
PURGE_ROUNDS = 10


@dataclass
class RetentionReport(Report):
    #: batches taken (each one transaction)
    batches: int = 0
    jobs_deleted: int = 0
    results_dropped: int = 0
    events_deleted: int = 0
    #: stored files deleted with their jobs or results
    files_deleted: int = 0
    audit_deleted: int = 0


class Retention:
    name = "retention"
    frequent = False
    #: rows of each kind one batch purges at most
    batch = 500

    def __init__(self, interval: float) -> None:
        self.interval = interval
        #: where each step of the next run may start
        self.horizon: Horizon[RetentionHorizons] = Horizon()

    @classmethod
    def from_settings(cls, settings: Settings) -> Retention:
        return cls(settings.maintenance_interval(cls.name))

    def run(self, process: WorkerProcess) -> RetentionReport:
        report = RetentionReport()
        start = self.horizon.start()
        for _ in range(PURGE_ROUNDS):
            with transaction(process.engine, actor="sweeper") as conn:
                purged = store.purge_finished(conn, batch=self.batch, horizons=start)
                audit_deleted = audit.purge(conn, batch=self.batch)
            start = self.horizon.at = purged["horizons"]
            report.batches += 1
            report.jobs_deleted += purged["jobs_deleted"]
            report.results_dropped += purged["results_dropped"]
            report.events_deleted += purged["events_deleted"]
            report.audit_deleted += audit_deleted
            # Committed: the rows no longer name these files. A delete that fails here leaves
            # the file to the orphan sweep (result_orphans.py).
            for ref in purged["dropped_refs"]:
                report.files_deleted += delete_quietly(process.results(), ref,
                                                       {"chore": "retention"})
            if max(purged["jobs_deleted"], purged["results_dropped"], purged["events_deleted"],
                   audit_deleted) < self.batch:
                break  # caught up: what is left is younger than the policy's ages
        return report
