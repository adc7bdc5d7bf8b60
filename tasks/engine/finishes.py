"""The buffer of finished results, and when it is flushed.

A job that returned waits here, and is committed, fenced per row and with the requesters'
standing re-checked for the whole batch in one query, in the same transaction that leases the
next batch (:meth:`FinishBuffer.flush` with a claim). It is flushed alone (a claim of 0)

- when it has waited ``FLUSH_AFTER`` seconds and another job is about to start: a long job
  must not hold finished results hostage;
- before a job with a hard time limit starts: the heartbeat may kill the process under it,
  and the finished results must not die with it;
- before the process goes idle or stops (the runner's loop).

A process killed with results still here loses no job: the leases expire and the jobs run
again (at least once, as before batching).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from uuid import UUID

from spacejobs.models.jobs.records import KindControl
from spacejobs.models.jobs.store import NO_ORGANIZATION
from spacejobs.models.kinds import JobKind
from spacejobs.models.results.attempt import delete_quietly
from spacejobs.tasks.engine.ends import Ends, Outcome
from spacejobs.tasks.engine.leases import Finished, FinishReport
from spacejobs.tasks.engine.ports import Ports

log = logging.getLogger("spacejobs.runner")

#: a completed job's result may wait this long for the next claim before it is flushed alone
FLUSH_AFTER = 0.005


class FinishBuffer:
    def __init__(self, ports: Ports, ends: Ends, *,
                 clock: Callable[[], float] = time.monotonic,
                 flush_after: float = FLUSH_AFTER) -> None:
        self.ports = ports
        self.ends = ends
        self.clock = clock
        self.flush_after = flush_after
        self.pending: list[Finished] = []
        self._since = 0.0

    def __bool__(self) -> bool:
        return bool(self.pending)

    def add(self, finished: Finished) -> None:
        if not self.pending:
            self._since = self.clock()
        self.pending.append(finished)

    def due_before(self, kind: JobKind | None) -> bool:
        """Whether to flush alone before the next job (of ``kind``) starts."""
        if not self.pending:
            return False
        waited_long = self.clock() - self._since > self.flush_after
        return waited_long or (kind is not None and bool(kind.rules.hard_time_limit))

    def flush(self, *, claim: int = 0, controls: list[KindControl] | None = None,
              after_organization: UUID = NO_ORGANIZATION) -> FinishReport:
        """Commit the pending finishes and lease up to ``claim`` more, in one transaction; the
        report's leased jobs are the caller's."""
        pending, self.pending = self.pending, []
        try:
            report = self.ports.leases.finish_and_claim(pending, claim=claim, controls=controls,
                                                        after_organization=after_organization)
        except Exception:
            # The results stay uncommitted: their leases expire and the jobs run again. Their
            # files stay too: the commit may have happened before the connection broke, and
            # only the orphan sweep, which asks the rows, can tell.
            for item in pending:
                self.ends.end(item.job, Outcome.CRASHED, item.seconds)
            raise
        self._settle(pending, report)
        return report

    def _settle(self, pending: list[Finished], report: FinishReport) -> None:
        seconds = {f.job.id: f.seconds for f in pending}
        self._delete_unrecorded_files(pending, report)
        for job in report.completed:
            self.ends.end(job, Outcome.COMPLETED, seconds[job.id])
        for job, refusal in report.refused:
            log.info("job refused at its finish: %s", refusal.code, extra=job.log_context)
            self.ends.end(job, Outcome.FAILED, seconds[job.id])
        # The database counts each under its kind (complete_jobs() in the schema: the metric's
        # labels are the database's own kinds).
        for job in report.stale:
            log.warning("stale finish discarded: a newer attempt owns the job",
                        extra=job.log_context)
            self.ends.end(job, Outcome.STALE_FINISH, seconds[job.id])

    def _delete_unrecorded_files(self, pending: list[Finished], report: FinishReport) -> None:
        """A stale or refused finish recorded no result: nothing will ever serve its file."""
        refs = {f.job.id: f.result_ref for f in pending if f.result_ref}
        for job in [*report.stale, *(job for job, _refusal in report.refused)]:
            if job.id in refs:
                delete_quietly(self.ports.results, refs[job.id], job.log_context)
