"""The organizations' audit log: who started, cancelled or downloaded which job, who joined or
left an organization or changed role, and how its state changed.

Each entry is written in the transaction of its action, so a rolled-back action leaves none
and a committed one always has its own. Most are written by the database where the action
already is a statement of its own: submits by submit_job()/submit_jobs(), membership and state
changes by triggers, cancels by the cancel statement (models.jobs.store.request_cancel). A
download is a read, so :func:`record_download` writes it.

Owners and admins read the log; no application role may change or delete an entry, and
retention (:func:`purge`) deletes old ones through a function that runs as the owner, past
the age the database's retention policy holds (its caller cannot choose it). An entry
holds names and ids only, never a job's params or result.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from spacejobs.models.db.queries import queries_beside
from spacejobs.models.errors import InsufficientRole, InvalidRequest
from spacejobs.models.jobs.records import Job
from spacejobs.models.tenancy.access import Membership, has_role

Q = queries_beside(__file__)

ACTIONS = ("job.submit", "job.debounce", "job.cancel", "job.resume", "job.download", "member.add",
           "member.role_change", "member.remove", "organization.state_change")
#: the least role that reads an organization's log
READER_ROLE = "admin"


@dataclass(frozen=True)
class AuditEntry:
    id: int
    organization_id: UUID
    actor_id: UUID | None
    actor: str
    action: str
    job_id: UUID | None
    member_id: UUID | None
    detail: dict[str, Any]
    request_id: str | None
    at: datetime


def record_download(conn: Connection, job: Job, user_id: UUID, request_id: str | None) -> None:
    """``user_id`` read ``job``'s result, in the caller's transaction (scoped to its organization)."""
    conn.execute(Q["record_download"], {
        "organization_id": job.organization_id, "user_id": user_id, "job_id": job.id,
        "kind": job.kind, "request_id": request_id})


def entries(
    conn: Connection,
    membership: Membership,
    *,
    action: str | None = None,
    before: tuple[datetime, int] | None = None,
    limit: int = 50,
) -> list[AuditEntry]:
    """The organization's log, newest first, for an owner or admin (else InsufficientRole);
    ``before`` is the (at, id) of the last entry of the previous page."""
    if not has_role(membership, READER_ROLE):
        raise InsufficientRole("Reading the audit log needs the admin or owner role.")
    if action is not None and action not in ACTIONS:
        raise InvalidRequest("Unknown action filter.", fields=["action"])
    rows = conn.execute(Q["entries"], {
        "organization_id": membership.organization_id, "action": action,
        "before_at": before[0] if before else None, "before_id": before[1] if before else None,
        "limit": limit}).mappings()
    return [AuditEntry(**row) for row in rows]


def purge(conn: Connection, *, batch: int = 1000) -> int:
    """Retention: delete at most ``batch`` entries older than the database's policy says
    (models/ops/retention.py); returns how many."""
    deleted: int = conn.execute(Q["purge"], {"batch": batch}).scalar_one()
    return deleted
