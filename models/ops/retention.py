"""The retention policy: how long finished jobs, their results and events, and the
organizations' audit log are kept.

The ages live in the database (``retention_policy``), not in the sweeper's settings: the purge
functions that delete history run as the owner, and the worker role that calls them chooses only
a batch size. Only the owner writes the policy: ``spacejobs retention set``, and
``spacejobs db upgrade`` from ``SPACEJOBS_KEEP_*`` when those are set.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection

from spacejobs.models.db.queries import queries_beside
from spacejobs.models.errors import InvalidRequest
from spacejobs.models.settings import Settings

Q = queries_beside(__file__)

DAY = 86_400.0
#: the longest age the policy takes (a century): past it, an interval stops meaning anything
MAX_DAYS = 36_525.0


@dataclass(frozen=True)
class RetentionPolicy:
    """Ages in days."""

    jobs_days: float
    results_days: float
    events_days: float
    audit_days: float


def read(conn: Connection) -> RetentionPolicy:
    row = conn.execute(Q["read"]).one()
    return RetentionPolicy(float(row.jobs_seconds) / DAY, float(row.results_seconds) / DAY,
                           float(row.events_seconds) / DAY, float(row.audit_seconds) / DAY)


def change(conn: Connection, *, jobs_days: float | None = None, results_days: float | None = None,
           events_days: float | None = None, audit_days: float | None = None) -> RetentionPolicy:
    """Set the ages given (days, more than 0), keep the others; as the owner. Returns the policy."""
    ages = {"jobs": jobs_days, "results": results_days, "events": events_days, "audit": audit_days}
    for name, days in ages.items():
        if days is not None and not 0 < days <= MAX_DAYS:
            raise InvalidRequest(f"The {name} retention is a number of days above 0 and at most "
                                 f"{MAX_DAYS:g}.")
    conn.execute(Q["update"], {f"{name}_seconds": None if days is None else days * DAY
                               for name, days in ages.items()})
    return read(conn)


def apply_settings(conn: Connection, settings: Settings) -> RetentionPolicy:
    """Write the ``SPACEJOBS_KEEP_*`` ages that are set into the policy (``db upgrade``); those
    not set leave the database's own value, whoever chose it."""
    return change(conn, jobs_days=settings.keep_jobs_days, results_days=settings.keep_results_days,
                  events_days=settings.keep_events_days, audit_days=settings.keep_audit_days)
