"""Periodic jobs: a kind run on a schedule, for an organization and a requester named in
configuration (never in a message), created exactly once per period however many beats run.

The schedule comes from the kind (``@job_kind(..., schedule="*/15 * * * *")``) or from the
configuration entry, which wins. It is a cron expression (croniter) or ``every <n><s|m|h|d>``.
Each period has a key (the schedule's latest fire time at or before now, in UTC) and the job
is submitted with the Idempotency-Key ``periodic:<name>:<key>``: the unique index on idempotency
keys makes a second beat's submit of the same period a replay, not a second job.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from croniter import croniter
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Connection

from spacejobs.models.errors import InvalidRequest
from spacejobs.models.jobs import service
from spacejobs.models.kinds import get_kind

_EVERY = re.compile(r"every\s+(\d+)\s*([smhd])", re.IGNORECASE)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class PeriodicEntry(BaseModel):
    """One periodic job, as configured (SPACEJOBS_PERIODIC_JOBS, a JSON list of these)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")
    kind: str
    organization_id: UUID
    requested_by: UUID
    params: dict[str, Any] = Field(default_factory=dict)
    schedule: str | None = None


@dataclass(frozen=True)
class Schedule:
    """A cron expression, or a fixed interval counted from the epoch (so every beat agrees)."""

    text: str
    every: timedelta | None = None

    @classmethod
    def parse(cls, text: str) -> Schedule:
        interval = _EVERY.fullmatch(text.strip())
        if interval:
            seconds = int(interval.group(1)) * _UNITS[interval.group(2).lower()]
            if seconds <= 0:
                raise InvalidRequest(f"The schedule {text!r} has no length.")
            return cls(text, timedelta(seconds=seconds))
        if not croniter.is_valid(text):
            raise InvalidRequest(f"The schedule {text!r} is neither a cron expression nor "
                                 "'every <n><s|m|h|d>'.")
        return cls(text)

    def period(self, now: datetime) -> datetime:
        """The start of the period ``now`` is in: the latest fire time at or before it."""
        now = now.astimezone(UTC)
        if self.every is not None:
            step = self.every.total_seconds()
            return datetime.fromtimestamp(now.timestamp() // step * step, UTC)
        return croniter(self.text, now + timedelta(microseconds=1)).get_prev(datetime)


@dataclass(frozen=True)
class Periodic:
    """An entry with its schedule resolved and its kind and params checked."""

    entry: PeriodicEntry
    schedule: Schedule

    def key(self, period: datetime) -> str:
        return f"periodic:{self.entry.name}:{period.isoformat()}"


def resolve(entries: list[PeriodicEntry]) -> list[Periodic]:
    """Check the configuration once, at beat's start: every kind exists, its params are valid,
    and it has a schedule (from the entry or from the kind)."""
    resolved = []
    for entry in entries:
        kind = get_kind(entry.kind)
        kind.parse_params(entry.params)
        text = entry.schedule or kind.rules.schedule
        if not text:
            raise InvalidRequest(f"The periodic job {entry.name!r} has no schedule: give one in "
                                 f"its entry or on the kind {entry.kind!r}.")
        resolved.append(Periodic(entry, Schedule.parse(text)))
    return resolved


def submit_period(jobs: service.Jobs, conn: Connection, periodic: Periodic,
                  period: datetime) -> service.Submitted:
    """This period's job, in the caller's transaction (a replay when another beat was first)."""
    entry = periodic.entry
    return jobs.submit(conn, entry.kind, entry.params, organization_id=entry.organization_id,
                       requested_by=entry.requested_by, idempotency_key=periodic.key(period),
                       request_id=f"periodic-{entry.name}")
