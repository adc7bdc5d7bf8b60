"""What a running job sees: its leased row, tenant-scoped transactions, progress, checkpoints.

A kind's function receives a :class:`JobContext`. Everything it may act on comes from the
leased ROW (never from the broker's message), and everything it writes is fenced by the lease.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import IO, TYPE_CHECKING, Any, Protocol
from uuid import UUID

from sqlalchemy import Connection

from models.errors import CancelRequested, LeaseLost, ReleaseRequested, TimedOut
from models.jobs import fanout
from models.jobs.records import LeasedJob, Status
from models.kinds.rules import KindRules
from models.results.attempt import AttemptResults
from models.results.records import StoredResult
from models.tenancy.projects import Projects

if TYPE_CHECKING:
    from models.jobs.store import Child


class Tenant:
    """Repositories bound to one tenant-scoped transaction."""

    def __init__(self, conn: Connection, organization_id: UUID) -> None:
        self.conn = conn
        self.projects = Projects(conn, organization_id)


class LeaseFlags:
    """What the worker process has learnt about one held lease since it was taken: lost to a
    newer attempt, or asked to cancel. Set by the process's heartbeat (and by the job's own
    writes), read at every checkpoint. Shared between threads, hence Events."""

    def __init__(self) -> None:
        self.lost = threading.Event()
        self.cancel = threading.Event()

    def note(self, status: Status | None) -> None:
        """Record what the database said about the lease (None: it is no longer ours)."""
        if status is None:
            self.lost.set()
        elif status == Status.CANCEL_REQUESTED:
            self.cancel.set()


class JobRuntime(Protocol):
    """The database side of a running job (models.jobs.leases.WorkerLeases in a worker; a fake
    in the runner's unit tests)."""

    def tenant(self, job: LeasedJob, rules: KindRules) -> AbstractContextManager[Tenant]: ...

    def record_progress(self, job: LeasedJob, progress: dict[str, Any]) -> Status | None: ...

    def lease_status(self, job: LeasedJob) -> Status | None: ...

    def spawn_children(self, job: LeasedJob, kind: KindRules,
                       items: Sequence[tuple[int, dict[str, Any]]]) -> int: ...

    def children(self, job: LeasedJob) -> list[Child]: ...

    def cancel_children(self, job: LeasedJob) -> int: ...


class JobContext:
    def __init__(
        self,
        runtime: JobRuntime,
        job: LeasedJob,
        rules: KindRules,
        *,
        flags: LeaseFlags | None = None,
        deadline: float | None = None,
        should_release: Callable[[], bool] | None = None,
        results: AttemptResults | None = None,
    ) -> None:
        self.runtime = runtime
        self.job = job
        self.rules = rules
        self.flags = flags or LeaseFlags()
        self.deadline = deadline  # time.monotonic() value of the soft time limit
        # Asked by the worker's shutdown: True once the grace period for running jobs is over.
        self._should_release = should_release or (lambda: False)
        self.results = results or AttemptResults(None, job)

    def tenant(self) -> AbstractContextManager[Tenant]:
        """A NEW transaction scoped to the job's organization (taken from the leased row).

        It first re-reads the requester's membership and the organization's state (and holds
        them until commit), and before committing it locks the job row with our lease token:
        tenant writes commit only while this attempt still holds the job.
        """
        self.checkpoint()
        return _Fenced(self, self.runtime.tenant(self.job, self.rules))

    def progress(self, stage: str, *, done: int | None = None, total: int | None = None) -> None:
        """Record a measured stage; a progress write that finds no lease means the lease is lost."""
        value: dict[str, Any] = {"stage": stage}
        if done is not None:
            value["done"] = done
        if total is not None:
            value["total"] = total
        self.flags.note(self.runtime.record_progress(self.job, value))
        self.checkpoint()

    def store_result(self, source: bytes | IO[bytes], *, content_type: str,
                     filename: str) -> StoredResult:
        """Put a large result (a file: a ZIP, a CSV...) in the results store and return what the
        kind then returns as its result. The web serves it from ``…/result`` with this content
        type, as an attachment named ``filename``, to current members holding the kind's role.

        The file is written now, before the finish; if the attempt does not finish with it (an
        exception, a lost lease, a stale finish) it is deleted again. ``source`` is bytes or a
        binary file object read to its end (a ``tempfile.SpooledTemporaryFile`` keeps a large
        one out of memory).
        """
        self.checkpoint()
        return self.results.put(source, content_type=content_type, filename=filename)

    def checkpoint(self) -> None:
        """A safe point: stop here if the lease is lost, a cancel was asked for, time is up, or
        the worker is shutting down and may wait no longer."""
        if self.flags.lost.is_set():
            raise LeaseLost()
        if self.flags.cancel.is_set():
            raise CancelRequested()
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise TimedOut(permanent=not self.rules.retry_on_timeout)
        if self._should_release():
            raise ReleaseRequested()

    def fan_out(self, kind: str, items: Sequence[dict[str, Any]], *, max_parallel: int = 4
                ) -> list[Any]:
        """One child job of ``kind`` per item, at most ``max_parallel`` at a time; their results
        in input order (models/jobs/fanout.py)."""
        return fanout.fan_out(self, kind, items, max_parallel=max_parallel)

    def check_lease_now(self) -> None:
        """Checkpoint after asking the database (the heartbeat does this in the background)."""
        self.flags.note(self.runtime.lease_status(self.job))
        self.checkpoint()

    @property
    def lease_lost(self) -> bool:
        return self.flags.lost.is_set()


class _Fenced(AbstractContextManager[Tenant]):
    """The tenant transaction, marking the lease lost when its fence refused the commit."""

    def __init__(self, ctx: JobContext, inner: AbstractContextManager[Tenant]) -> None:
        self._ctx = ctx
        self._inner = inner

    def __enter__(self) -> Tenant:
        return self._inner.__enter__()

    def __exit__(self, *exc_info: Any) -> bool | None:
        try:
            return self._inner.__exit__(*exc_info)
        except LeaseLost:
            self._ctx.flags.lost.set()
            raise
