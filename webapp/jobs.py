"""Starting a job and paging through an organization's jobs: one path for the JSON API and the
pages, so a job started from a button obeys exactly the rules of ``POST …/jobs``."""

from __future__ import annotations

import base64
import binascii
import logging
from datetime import datetime
from typing import Any
from uuid import UUID

from flask import current_app, g
from sqlalchemy import Connection

from models.errors import InvalidRequest
from models.jobs import store
from models.jobs.records import ALL_STATUSES, Job
from models.kinds import get_kind
from models.tenancy.access import check_allowed
from models.tenancy.accounts import User
from webapp.auth import org_transaction

log = logging.getLogger("spacejobs.web")

PAGE_SIZE = 50


def start_job(
    org: str,
    user: User,
    kind_name: str,
    raw_params: Any,
    *,
    dedup_key: str | None = None,
    idempotency_key: str | None = None,
) -> tuple[Job, bool]:
    """Validate, then in ONE transaction check membership and organization state and insert the
    row (+ event); publish the wake-up only after COMMIT. Returns ``(job, created)``."""
    kind = get_kind(kind_name)
    params = kind.parse_params(raw_params).model_dump(mode="json")
    if dedup_key is not None and not kind.rules.dedupable:
        raise InvalidRequest("This kind of job cannot be de-duplicated.", fields=["dedup_key"])
    with org_transaction(org, user) as (conn, membership):
        check_allowed(membership, org_states=kind.rules.org_states, role=kind.rules.role)
        job, created = store.submit(
            conn,
            organization_id=membership.organization_id,
            requested_by=user.id,
            kind=kind.rules,
            params=params,
            dedup_key=dedup_key,
            idempotency_key=idempotency_key,
            request_id=g.request_id,
        )
    log.info("job submitted" if created else "job submit replayed",
             extra={"request_id": g.request_id, "job_id": str(job.id), "kind": job.kind,
                    "organization_id": str(job.organization_id), "attempt": 0})
    # Only after COMMIT: a wake-up for a row that does not exist would be worse than none.
    if created:
        current_app.extensions["spacejobs.wakeups"].wake(str(job.id))
    return job, created


def list_page(
    conn: Connection, organization_id: UUID, *, status: str | None, kind: str | None,
    cursor: str | None, limit: int = PAGE_SIZE,
) -> tuple[list[Job], str | None]:
    """Newest first, keyset pagination: the jobs and the cursor of the next (older) page."""
    if status is not None and status not in ALL_STATUSES:
        raise InvalidRequest("Unknown status filter.", fields=["status"])
    page = store.list_for_org(conn, organization_id, status=status, kind=kind,
                              before=decode_cursor(cursor), limit=limit + 1)
    more = len(page) > limit
    page = page[:limit]
    return page, encode_cursor(page[-1]) if more else None


def encode_cursor(job: Job) -> str:
    raw = f"{job.created_at.isoformat()}|{job.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> tuple[datetime, UUID] | None:
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created, _, jid = raw.partition("|")
        return datetime.fromisoformat(created), UUID(jid)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequest("The cursor is not valid.", fields=["cursor"]) from None
