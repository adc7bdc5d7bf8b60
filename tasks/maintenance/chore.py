"""What every chore is, and the two things several of them share: the wake-ups for the jobs they
put back in the queue, and where a run may start reading (``Horizon``).

A chore is a name, a cadence (seconds between the end of one run and the start of the next)
and one ``run(process)`` that does its chore once, in bounded batches, as the given worker
process (its engine, its publisher, its results store, its settings), and returns a report of
what it did: beat logs it, a test reads it. A run that raises is beat's to log and retry
(tasks/maintenance/schedule.py); a chore never catches its own database errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Generic, Protocol, TypeVar
from uuid import UUID

from spacejobs.tasks.worker_process import WorkerProcess

Place = TypeVar("Place")


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


class Horizon(Generic[Place]):
    """Where a chore's next run may start reading (a moment, an id: what the database answered
    after the last run), kept per beat process, so that behind a long-open transaction a run
    does not walk from the first entry of an index that keeps every row it handled since.

    The horizon is a shortcut the database argues for, not the guarantee: a row can commit
    behind it (a transaction begun earlier, another beat's batch rolled back). So the first run,
    and every ``full_every``-th after it, starts from the first row (``start()`` answers None).
    """

    def __init__(self, full_every: int = 60) -> None:
        #: runs between two from the first row (60: 5 minutes at the sweep's 5 s)
        self.full_every = full_every
        self.runs = 0
        #: where the next run may start (None: nothing answered yet)
        self.at: Place | None = None

    def start(self) -> Place | None:
        """Where this run starts (None: from the first row); counts the run."""
        from_first = self.runs % self.full_every == 0
        self.runs += 1
        return None if from_first else self.at
