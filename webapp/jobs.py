"""Starting a job and paging through an organization's jobs: one path for the JSON API and the
pages, so a job started from a button obeys exactly the rules of ``POST …/jobs``."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any
from uuid import UUID

from flask import current_app, g
from sqlalchemy import Connection

from models.errors import InvalidRequest
from models.jobs import service, store
from models.jobs.records import ALL_STATUSES, Job
from models.tenancy.access import Membership
from models.tenancy.accounts import User
from webapp.auth import org_transaction
from webapp.paging import decode_cursor, page_of

log = logging.getLogger("spacejobs.web")

PAGE_SIZE = 50


def start_job(
    org: str,
    user: User,
    kind_name: str,
    raw_params: Any,
    *,
    dedup_key: str | None = None,
) -> tuple[Job, bool]:
    """For the pages: a transaction of its own around :func:`submit_in`."""
    with org_transaction(org, user) as (conn, membership):
        return submit_in(conn, membership, user, kind_name, raw_params, dedup_key=dedup_key)


def submit_in(
    conn: Connection,
    membership: Membership,
    user: User,
    kind_name: str,
    raw_params: Any,
    *,
    dedup_key: str | None = None,
    idempotency_key: str | None = None,
    run_after: datetime | None = None,
    priority: int = 0,
) -> tuple[Job, bool]:
    """In the request's ONE transaction (membership already checked): the kind's rules checked
    and the row (+ event) inserted by models.jobs.service.submit; the wake-up goes out after
    COMMIT. Returns ``(job, created)``."""
    submitted = service.submit(
        conn, kind_name, raw_params, organization_id=membership.organization_id,
        requested_by=user.id, dedup_key=dedup_key, idempotency_key=idempotency_key,
        run_after=run_after, priority=priority, request_id=g.request_id,
        wake=current_app.extensions["spacejobs.wakeups"].wake)
    job = submitted.job
    log.info("job submitted" if submitted.created else "job submit replayed",
             extra={"request_id": g.request_id, "job_id": str(job.id), "kind": job.kind,
                    "organization_id": str(job.organization_id), "attempt": 0})
    return job, submitted.created


def submit_many_in(conn: Connection, membership: Membership, user: User,
                   requests: list[service.JobRequest]) -> list[Job]:
    """Many jobs, all or nothing (models.jobs.service.submit_many), in the request's transaction."""
    jobs = service.submit_many(
        conn, requests, organization_id=membership.organization_id, requested_by=user.id,
        request_id=g.request_id, wake=current_app.extensions["spacejobs.wakeups"].wake)
    log.info("%d jobs submitted", len(jobs), extra={
        "request_id": g.request_id, "organization_id": str(membership.organization_id)})
    return jobs


def list_page(
    conn: Connection, organization_id: UUID, *, status: str | None, kind: str | None,
    cursor: str | None, limit: int = PAGE_SIZE,
) -> tuple[list[Job], str | None]:
    """Newest first, keyset pagination: the jobs and the cursor of the next (older) page."""
    if status is not None and status not in ALL_STATUSES:
        raise InvalidRequest("Unknown status filter.", fields=["status"])
    rows = store.list_for_org(conn, organization_id, status=status, kind=kind,
                              before=decode_cursor(cursor, UUID), limit=limit + 1)
    return page_of(rows, limit, lambda job: (job.created_at, job.id))
