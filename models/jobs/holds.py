"""Why a job that has not ended is not running now, in one place, for the JSON, the pages and
the operators' dashboard: :func:`why_waiting`.

A waiting job says it in its own row (a moment, a signal, its children). A queued job is held
by the queue's flow control, which only the database sees whole (the operators' rate limits
and each window's recent starts are the owner's tables): ``queued_jobs_held()`` answers for a
page of jobs in one statement of index probes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from uuid import UUID

from sqlalchemy import Connection

from spacejobs.models.db.queries import queries_beside
from spacejobs.models.jobs.records import Job, Status
from spacejobs.models.jobs.store import declared_rate_limits

Q = queries_beside(__file__)


class Reason(StrEnum):
    """What a job waits for. The first three hold a queued job back, the rest a waiting one."""

    SEQUENCE = "sequence"  # an earlier job of its sequence has not ended (``behind``)
    DELAYED = "delayed"  # its start was put off (a delay, a retry's backoff): ``until``
    RATE_LIMIT = "rate_limit"  # its kind's rate limit window is full: ``until`` it lets one more
    SIGNAL = "signal"  # a signal (``signal``), ``until`` a deadline if it has one
    CHILDREN = "children"  # its children (``children``: how many were active when it began)
    MOMENT = "moment"  # a moment (``until``)


@dataclass(frozen=True)
class Waiting:
    """Why a job waits: the reason, and what it names (a moment, the job it waits behind, a
    signal's name, a number of children)."""

    reason: Reason
    until: datetime | None = None
    behind: UUID | None = None
    signal: str | None = None
    children: int | None = None


def why_waiting(conn: Connection, jobs: Iterable[Job]) -> Mapping[UUID, Waiting]:
    """Why each of ``jobs`` that waits does, by job id: a waiting job from its row, a queued job
    held back by a sequence, a delay or a rate limit from one statement for all of them (read
    in the caller's transaction, under its scope: the web sees its organization's, an operator
    any). A queued job that nothing holds back (it starts as soon as a worker is free) and a job
    that is running or ended have no entry."""
    found: dict[UUID, Waiting] = {}
    queued = []
    for job in jobs:
        if job.status == Status.WAITING:
            found[job.id] = waiting_in_row(job)
        elif job.status == Status.QUEUED:
            queued.append(job.id)
    found.update(why_queued(conn, queued))
    return found


def why_queued(conn: Connection, job_ids: Iterable[UUID]) -> Mapping[UUID, Waiting]:
    """What holds each of these queued jobs back (a sequence, a delay, a full rate limit
    window), by job id, in one statement; a job that nothing holds back, or that is not queued
    (or not visible in the caller's scope), has no entry. The operators' dashboard, which reads
    rows rather than :class:`Job`, asks this directly."""
    ids = list(job_ids)
    if not ids:
        return {}
    kinds, max_starts, windows = declared_rate_limits()
    found: dict[UUID, Waiting] = {}
    for row in conn.execute(Q["queued_held"], {"ids": ids, "rate_kinds": kinds,
                                               "rate_max": max_starts,
                                               "rate_seconds": windows}):
        held = holding(row.delayed_until, row.behind, row.rate_limited_until)
        if held is not None:
            found[row.job_id] = held
    return found


def holding(delayed_until: datetime | None, behind: UUID | None,
            rate_limited_until: datetime | None) -> Waiting | None:
    """What holds a queued job back, the one it waits for first: a sequence (the job before it
    ends at no known moment), then the later of a delay and a full rate limit window."""
    if behind is not None:
        return Waiting(Reason.SEQUENCE, behind=behind)
    if delayed_until is not None and (rate_limited_until is None
                                      or delayed_until >= rate_limited_until):
        return Waiting(Reason.DELAYED, until=delayed_until)
    if rate_limited_until is not None:
        return Waiting(Reason.RATE_LIMIT, until=rate_limited_until)
    return None


def waiting_in_row(job: Job) -> Waiting:
    """What a waiting job waits for, from its row: a signal (with its deadline), its children,
    or a moment."""
    if job.wait_signal is not None:
        return Waiting(Reason.SIGNAL, until=job.wait_until, signal=job.wait_signal)
    if job.wait_children is not None:
        return Waiting(Reason.CHILDREN, until=job.wait_until, children=job.wait_children)
    return Waiting(Reason.MOMENT, until=job.wait_until)
