"""What every chore is, and the one thing several of them share: the wake-ups for the jobs they
put back in the queue.

A chore is a name, a cadence (seconds between the end of one run and the start of the next)
and one ``run(process)`` that does its chore once, in bounded batches, as the given worker
process (its engine, its publisher, its results store, its settings), and returns a report of
what it did: beat logs it, a test reads it. A run that raises is beat's to log and retry
(tasks/maintenance/schedule.py); a chore never catches its own database errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Protocol
from uuid import UUID

from spacejobs.tasks.worker_process import WorkerProcess


@dataclass
class Report:
    """Counts of what one run did (every field an int); a chore's own report adds its fields."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def add(self, other: Report) -> None:
        """Add another run's counts of the same chore to these."""
        for field in fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


class Chore(Protocol):
    #: the chore's name in the log, the settings (``Settings.maintenance_interval``) and the docs
    name: str
    #: seconds between the end of one run and the start of the next
    interval: float
    #: runs several times a second: its runs are added up into beat's next line, not logged one
    #: line each
    frequent: bool

    def run(self, process: WorkerProcess) -> Report: ...


def publish_wakeups(process: WorkerProcess, job_ids: Sequence[UUID]) -> tuple[int, int]:
    """Wake-ups for jobs a chore put back in the queue: (published, jobs left unwoken because
    the broker is down)."""
    # One wake-up per claim batch of due jobs, not one per job: a woken process claims up to a
    # batch at once, drains until nothing is due and wakes another process when more is due
    # than it took, so more messages would only be pool processes finding the queue empty.
    # (The chaos run once left 29,061 wake-ups in Redis after a backlog, one per job.)
    per_wakeup = process.settings.claim_batch
    sent = 0
    for first in range(0, len(job_ids), per_wakeup):
        if not process.publisher.wake(str(job_ids[first]), force=True):
            # The broker is down: stop trying for this run. The rows are queued, and the
            # resignal chore re-sends their wake-ups (resignal.py says when).
            return sent, len(job_ids) - first
        sent += 1
    return sent, 0
