"""What a member may do with their organization's jobs beyond submitting one: cancel it, read
its result. The JSON API, the pages and the Python API (models.jobs.service) all come here:
the requester or a member with the kind's role may cancel (applied by the cancel statement
itself, models.jobs.store.request_cancel, which the operators' cancel shares); the result
needs the kind's role.

Every function runs in the caller's transaction, scoped to the organization, after
:func:`models.tenancy.access.require_membership` gave the CURRENT membership.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from models.db.queries import queries_beside
from models.errors import JobNotCompleted, NotFound, ResultExpired
from models.jobs import store
from models.jobs.records import ACTIVE, Job, Status
from models.kinds import kind_roles, required_role
from models.results.records import StoredResult
from models.tenancy import audit
from models.tenancy.access import (
    Membership,
    check_may_read_result,
    may_cancel,
    may_read_result,
)

Q = queries_beside(__file__)


@dataclass(frozen=True)
class JobRights:
    """What the pages offer for one job, by the same rules the actions enforce."""

    kind_role: str
    may_cancel: bool
    may_read_result: bool


def rights(membership: Membership, job: Job) -> JobRights:
    role = required_role(job.kind)
    return JobRights(
        kind_role=role,
        may_cancel=job.status in ACTIVE and job.status != Status.CANCEL_REQUESTED
        and may_cancel(membership, job.requested_by, role),
        may_read_result=may_read_result(membership, role),
    )


def cancel(conn: Connection, membership: Membership, job_id: UUID,
           request_id: str | None = None) -> Job:
    """queued → cancelled, leased → cancel_requested, if this member may stop this job (and
    written to the organization's audit log, in the same statement); InsufficientRole if not.
    ``membership`` is the caller's proof that it read the current one (the statement reads it
    again, in the same snapshot as the row it changes)."""
    return store.request_cancel(conn, job_id, membership.user_id, request_id,
                                kind_roles=kind_roles())


def read_result(conn: Connection, membership: Membership, job_id: UUID,
                request_id: str | None = None) -> tuple[Job, Any, StoredResult | None]:
    """The result of a completed job; 409 while it is not, 410 after retention dropped it.

    For a result in the results store, the result is its descriptor and the third value says
    which file to stream (the row's own key: a client never names one). The download is written
    to the organization's audit log in the caller's transaction."""
    found = store.get_result(conn, job_id)
    if found is None:
        raise NotFound()
    job, result, ref = found
    check_may_read_result(membership, required_role(job.kind))
    if job.status != Status.COMPLETED:
        raise JobNotCompleted(status=job.status)
    if job.result_expired_at is not None:
        raise ResultExpired()
    audit.record_download(conn, job, membership.user_id, request_id)
    return job, result, StoredResult.from_row(ref, result) if ref else None


def request_id_of(conn: Connection, job_id: UUID) -> str | None:
    """The request id of the submit, for a failure's "contact support" line."""
    return conn.execute(Q["request_id_of"], {"id": job_id}).scalar_one_or_none()
