"""What the runner is given: the store and the heartbeat it works through (:class:`Ports`) and
the process it runs in (:class:`Signals`). Grouped so each part of the runner takes the few it
uses, and a unit test can hand in fakes (tests/unit/fake_leases.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol
from uuid import UUID

from spacejobs.models.jobs.records import KindControl, LeasedJob, Status
from spacejobs.models.kinds.rules import KindRules
from spacejobs.models.results.attempt import DEFAULT_INLINE_MAX_BYTES
from spacejobs.models.results.store import ResultStore
from spacejobs.tasks.engine.context import JobRuntime, LeaseFlags
from spacejobs.tasks.engine.leases import Failure, Finished, FinishReport


class Leases(JobRuntime, Protocol):
    """What the runner needs of the store (models.jobs.leases.WorkerLeases, or a fake)."""

    def finish_and_claim(self, finished: Sequence[Finished], *, claim: int,
                         controls: list[KindControl] | None = None,
                         after_organization: UUID = ...) -> FinishReport: ...

    def fail(self, job: LeasedJob, failure: Failure) -> Status | None: ...

    def acknowledge_cancel(self, job: LeasedJob) -> bool: ...

    def release(self, jobs: Sequence[LeasedJob]) -> set[UUID]: ...

    def wait(self, job: LeasedJob, until: datetime | None, signal: str | None,
             children: int | None) -> Status | None: ...


class Keeper(Protocol):
    """The process's heartbeat (tasks.heartbeat.LeaseKeeper)."""

    def hold(self, jobs: Sequence[LeasedJob]) -> None: ...

    def drop(self, job_ids: Sequence[UUID]) -> None: ...

    def flags(self, job_id: UUID) -> LeaseFlags: ...

    def running(self, job: LeasedJob, rules: KindRules, started: float) -> None: ...

    def idle(self) -> None: ...


@dataclass(frozen=True)
class Ports:
    """The database and the results store, as the runner reaches them."""

    leases: Leases
    keeper: Keeper
    #: the operators' claim controls (pauses, limits), read before each claim
    controls: Callable[[], list[KindControl]] = list
    #: where large results go (None: every result stays inline, and storing a file fails)
    results: ResultStore | None = None
    inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES


def _never(*_: object) -> bool:
    return False


def _nobody(*_: object, **__: object) -> None:
    return None


@dataclass(frozen=True)
class Signals:
    """What the runner hears from its process and tells the other workers."""

    #: the worker is shutting down: start nothing more
    stop_requested: Callable[[], bool] = _never
    #: past the shutdown grace: a running job gives its lease back at its next checkpoint
    release_due: Callable[[], bool] = _never
    #: wait at most this many seconds for new work (a NOTIFY); True when some came
    wait_for_work: Callable[[float], bool] = _never
    #: ``publish_wake(job_id | None, countdown=...)``: a wake-up through the broker
    publish_wake: Callable[..., object] = _nobody
    #: tell another process there is work (a coalesced wake-up)
    fan_out: Callable[[], object] = _nobody
