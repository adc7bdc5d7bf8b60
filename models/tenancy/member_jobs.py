"""What a member may do with their organization's jobs beyond submitting one: cancel it, read
its result. The JSON API and the pages both come here, so one rule holds for both: the
requester or a member with the kind's role may cancel; the result needs the kind's role.

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
from models.kinds import required_role
from models.results.records import StoredResult
from models.tenancy import audit
from models.tenancy.access import (
    Membership,
    check_may_cancel,
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


def cancel(conn: Connection, membership: Membership, job_id: UUID, user_id: UUID,
           request_id: str | None = None) -> Job:
    """queued → cancelled, leased → cancel_requested, if this member may stop this job (and
    written to the organization's audit log, in the same statement)."""
    job = store.get(conn, job_id)
    if job is None:
        raise NotFound()
    # requested_by and kind are part of the job's immutable snapshot (the transition trigger
    # refuses to change them), so the check cannot go stale before the UPDATE below.
    check_may_cancel(membership, job.requested_by, required_role(job.kind))
    return store.request_cancel(conn, job_id, user_id, request_id)


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
