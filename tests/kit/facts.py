"""What the database says about jobs: the facts tests assert on and chaos invariants judge.

Each function reads through a connection the caller opened, as the role that may see what it
asks for (``space_worker`` for job rows, ``space_operator`` for events; a benchmark may read its
own database as the owner). Figures come from here, never from what a worker reports.
The SQL is in ``facts.sql`` beside this module.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from spacejobs.models.db.queries import queries_beside
from spacejobs.models.jobs.records import Status

Q = queries_beside(__file__)


def job_row(conn: Connection, job_id: str | uuid.UUID) -> dict[str, Any]:
    """Every column of one job (``lease_token`` included: a test may need it, a user never)."""
    return dict(conn.execute(Q["job_row"], {"id": str(job_id)}).mappings().one())


def job_events(conn: Connection, job_id: str | uuid.UUID) -> list[dict[str, Any]]:
    """The job's events in order: ``from_status``, ``to_status``, ``attempt``, ``actor``, ``at``."""
    return [dict(row) for row in conn.execute(Q["job_events"], {"id": str(job_id)}).mappings()]


def counts_by_status(conn: Connection, organization_id: uuid.UUID | None = None) -> Counter[Status]:
    """How many jobs are in each status (of one organization when given); absent ones count 0."""
    if organization_id is None:
        rows = conn.execute(Q["counts_by_status"])
    else:
        rows = conn.execute(Q["counts_by_status_in_organization"], {"org": organization_id})
    return Counter({Status(status): count for status, count in rows})


@dataclass(frozen=True)
class Outcome:
    """Where one job ended up (or is), keyed by its id in ``outcomes``."""

    status: Status
    attempts: int
    error_code: str | None


def outcomes(conn: Connection) -> dict[str, Outcome]:
    """Every job's status, attempts and error code, by job id (as text, as the API gives it)."""
    return {job_id: Outcome(Status(status), attempts, error_code)
            for job_id, status, attempts, error_code in conn.execute(Q["outcomes"])}


def child_job_ids(conn: Connection) -> set[str]:
    """The ids of every job a parent made (workflow steps, fan-out parts)."""
    return {job_id for (job_id,) in conn.execute(Q["child_job_ids"])}


def attempts_histogram(found: dict[str, Outcome], job_ids: Iterable[str]) -> dict[int, int]:
    """How many of these jobs took 1, 2, ... attempts (0: never claimed), from ``outcomes``."""
    return dict(sorted(Counter(found[job_id].attempts for job_id in job_ids if job_id in found).items()))


def still_leased(conn: Connection) -> int:
    """Rows that still hold a lease: once every job is terminal this must be 0."""
    return conn.execute(Q["still_leased"]).scalar_one()


def active_counts_off(owner: Connection) -> int:
    """(organization, kind) pairs whose active count, kept by the triggers for the quota, is not
    their number of active jobs: must be 0 at every commit. Needs the owner role."""
    return owner.execute(Q["active_counts_off"]).scalar_one()


def finished_twice(conn: Connection) -> int:
    """Jobs with more than one ``-> completed`` event: a second result, which must never be."""
    return conn.execute(Q["finished_twice"]).scalar_one()


def broken_event_links(conn: Connection) -> int:
    """Events whose ``from_status`` is not the ``to_status`` of the job's previous event."""
    return conn.execute(Q["broken_event_links"]).scalar_one()


def status_disagrees_with_events(conn: Connection) -> int:
    """Jobs whose status is not the ``to_status`` of their last event."""
    return conn.execute(Q["status_disagrees_with_events"]).scalar_one()


def expired_lease_takeovers(conn: Connection) -> tuple[int, int]:
    """(leases re-leased by a worker after they expired, leases the sweeper ended or requeued)."""
    relet, swept = conn.execute(Q["expired_lease_takeovers"]).one()
    return relet, swept


def resignalled_by_sweeper(conn: Connection) -> int:
    """Jobs whose last wake-up came from the sweeper rather than from their submit."""
    return conn.execute(Q["resignalled_by_sweeper"]).scalar_one()


def worker_claims(conn: Connection) -> list[tuple[str, datetime]]:
    """(actor, at) of every claim a worker made; the actor ends in the claiming process's pid."""
    return [(actor, at) for actor, at in conn.execute(Q["worker_claims"])]


def lease_holders(conn: Connection) -> dict[int, list[str]]:
    """Ids of the jobs leased right now, by the pid of the process holding each
    (``leased_by`` is ``host:pid``)."""
    held: dict[int, list[str]] = {}
    for leased_by, job_id in conn.execute(Q["leased_jobs"]):
        pid = (leased_by or "").rsplit(":", 1)[-1]
        if pid.isdigit():
            held.setdefault(int(pid), []).append(job_id)
    return held


def taken_over_between(conn: Connection, job_ids: list[str], began: float, ended: float) -> int:
    """How many of these jobs were re-leased or swept between two ``time.time()`` instants."""
    return conn.execute(Q["taken_over_between"],
                        {"ids": job_ids, "began": began, "ended": ended}).scalar_one()
