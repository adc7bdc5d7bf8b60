"""What bench.waiting reads for its figures (records.sql): the job rows and their events, as the
owner role, one organization at a time; never the workers' reports."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass

from sqlalchemy import Connection

from spacejobs.models.db.queries import queries_beside

Q = queries_beside(__file__)


@dataclass(frozen=True)
class Timer:
    """One timer's seconds after its due moment; None for what has not happened."""

    resumed_after: float | None  # waiting > queued (beat's round of due timers, or a sweep)
    leased_after: float | None  # the first lease after its resume
    completed_after: float | None
    waited: bool  # it went to waiting at all (its first run came before its moment)


@dataclass(frozen=True)
class DrainSpan:
    jobs: int
    clean: int  # completed in one attempt, events exactly queued > leased > completed
    seconds: float | None  # first lease to last completion


@dataclass(frozen=True)
class FanSpan:
    parent_status: str | None
    seconds: float | None  # the parent's first lease to its completion
    runs: int  # the parent's leases: one per run, each after a wait
    children: int
    clean_children: int


@dataclass(frozen=True)
class ChainSpan:
    workflow_status: str | None
    seconds: float | None  # the workflow's submit to its completion
    work: float | None  # the steps' own work: each one's lease to its completion, summed
    runs: int  # the workflow's leases
    steps: int
    clean_steps: int


@dataclass(frozen=True)
class GroupSpan:
    workflow_status: str | None
    seconds: float | None  # the workflow's submit to its completion
    steps_seconds: float | None  # its steps' first lease to their last completion
    given_back: int  # steps given back unstarted (leased > queued events)
    steps: int
    completed_once: int


@dataclass(frozen=True)
class CancelSpan:
    workflow_status: str | None
    grandchild_statuses: str | None  # the distinct statuses the grandchildren ended in
    grandchildren: int
    seconds: float | None  # the workflow's cancel to its last grandchild's cancelled event


def statuses(conn: Connection, org: uuid.UUID) -> Counter[str]:
    return Counter(dict(conn.execute(Q["statuses"], {"org": org}).all()))


def holding_a_lease(conn: Connection, org: uuid.UUID) -> int:
    return conn.execute(Q["holding_a_lease"], {"org": org}).scalar_one()


def forget(conn: Connection, org: uuid.UUID) -> None:
    conn.execute(Q["forget"], {"org": org})


def _seconds(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def timers(conn: Connection, org: uuid.UUID) -> list[Timer]:
    return [Timer(_seconds(resumed), _seconds(leased), _seconds(completed), waited)
            for resumed, leased, completed, waited in conn.execute(Q["timers"], {"org": org})]


def drain_span(conn: Connection, org: uuid.UUID) -> DrainSpan:
    row = conn.execute(Q["drain_span"], {"org": org}).one()
    return DrainSpan(row.jobs, row.clean, _seconds(row.seconds))


def fan_span(conn: Connection, org: uuid.UUID) -> FanSpan:
    row = conn.execute(Q["fan_span"], {"org": org}).one()
    return FanSpan(row.parent_status, _seconds(row.seconds), row.runs, row.children,
                   row.clean_children)


def chain_span(conn: Connection, org: uuid.UUID) -> ChainSpan:
    row = conn.execute(Q["chain_span"], {"org": org}).one()
    return ChainSpan(row.workflow_status, _seconds(row.seconds), _seconds(row.work), row.runs,
                     row.steps, row.clean_steps)


def group_span(conn: Connection, org: uuid.UUID) -> GroupSpan:
    row = conn.execute(Q["group_span"], {"org": org}).one()
    return GroupSpan(row.workflow_status, _seconds(row.seconds), _seconds(row.steps_seconds),
                     row.given_back, row.steps, row.completed_once)


def cancel_span(conn: Connection, org: uuid.UUID) -> CancelSpan:
    row = conn.execute(Q["cancel_span"], {"org": org}).one()
    return CancelSpan(row.workflow_status, row.grandchild_statuses, row.grandchildren,
                      _seconds(row.seconds))
