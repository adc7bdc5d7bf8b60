"""The default cap on each organization's active jobs, held by the database.

The submit functions read it as the owner (``quota_policy``), so no caller of theirs can choose
it: a compromised web or worker credential cannot submit past it. Operators override it per
organization and kind (``spacejobs orgs set-quota``, rows in ``job_quotas``). Only the owner
writes it: ``spacejobs orgs set-default-quota``, and ``spacejobs db upgrade`` from
``SPACEJOBS_ACTIVE_JOBS_QUOTA`` when that is set.
"""

from __future__ import annotations

from sqlalchemy import Connection

from spacejobs.models.db.queries import queries_beside
from spacejobs.models.errors import InvalidRequest
from spacejobs.models.settings import Settings

Q = queries_beside(__file__)

#: the column's type: a cap past it cannot be stored
MAX_CAP = 2**31 - 1


def read(conn: Connection) -> int:
    """The default cap, as the owner."""
    cap: int = conn.execute(Q["read"]).scalar_one()
    return cap


def change(conn: Connection, active_jobs: int) -> int:
    """Set the default cap (0 refuses every submit), as the owner; returns it."""
    if isinstance(active_jobs, bool) or not isinstance(active_jobs, int) \
            or not 0 <= active_jobs <= MAX_CAP:
        raise InvalidRequest(f"A quota is a whole number from 0 to {MAX_CAP}.")
    conn.execute(Q["update"], {"active_jobs": active_jobs})
    return read(conn)


def apply_settings(conn: Connection, settings: Settings) -> int:
    """Write ``SPACEJOBS_ACTIVE_JOBS_QUOTA`` into the policy when it is set (``db upgrade``);
    unset, the database keeps its own value, whoever chose it."""
    if settings.active_jobs_quota is not None:
        return change(conn, settings.active_jobs_quota)
    return read(conn)
