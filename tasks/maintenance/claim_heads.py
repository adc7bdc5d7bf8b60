"""Claim heads: each (organization, priority) key's head, where a claim starts reading its
queued jobs, moves forward past the jobs that left the queue (advance_claim_heads() in
models/db/schema/60_claim_and_lease.sql). Without it, a head stays where the jobs triggers put
it, and a claim reads every job finished since from the index, which behind a long-open
transaction vacuum cannot clean.

A head moves no further than ``SPACEJOBS_CLAIM_HEAD_LAG`` seconds ago, and not at all in a run
that meets an open transaction making jobs claimable (the run reports it as ``busy``): a head
may lag behind the queue, never pass a job in it. A key with no queued job and no work seen for
``idle`` seconds is dropped; the jobs triggers make it again with its next job. Safe in several
beats at once: the moves are taken under one exclusive lock, which a second beat only tries.
Every submit that makes a job claimable waits for that lock (shared), so the move runs as one
statement in a transaction of its own: the lock ends with the statement on the server, never
held by a beat paused between its BEGIN and its COMMIT. And a run visits at most
``orgs_per_run`` organizations, going on round the ring where the last one stopped: the lock is
held for a slice of the heads, however many organizations there are.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from spacejobs.models.db.transaction import statement_alone
from spacejobs.models.jobs import store
from spacejobs.models.settings import Settings
from spacejobs.tasks.maintenance.chore import Report
from spacejobs.tasks.worker_process import WorkerProcess


@dataclass
class ClaimHeadsReport(Report):
    #: heads moved forward (or marked busy again)
    moved: int = 0
    #: runs that moved nothing because a transaction making jobs claimable was open
    busy: int = 0


class ClaimHeads:
    name = "claim_heads"
    #: every second by default: its runs are added up into beat's next line
    frequent = True
    #: seconds a key with no queued job keeps its head after its last work
    idle = 300.0
    #: organizations a run visits: 500 take a few milliseconds (docs/benchmarks.md), so a
    #: submit waits no longer than that for the lock; 10,000 organizations are all visited in
    #: 20 runs, and a head that waits for its turn only lags (a claim reads a little more)
    orgs_per_run = 500

    def __init__(self, interval: float, lag: float) -> None:
        self.interval = interval
        self.lag = lag
        #: the last organization visited, per beat process: the next run goes on after it
        self.after: UUID | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> ClaimHeads:
        return cls(settings.maintenance_interval(cls.name), settings.claim_head_lag)

    def run(self, process: WorkerProcess) -> ClaimHeadsReport:
        with statement_alone(process.engine) as conn:
            run = store.advance_claim_heads(conn, lag=self.lag, idle=self.idle, after=self.after,
                                            orgs=self.orgs_per_run)
        self.after = run.last_org
        if run.moved is None:
            return ClaimHeadsReport(busy=1)
        return ClaimHeadsReport(moved=run.moved)
