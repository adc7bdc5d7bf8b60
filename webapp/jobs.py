"""The web's hold on the one job API (models.jobs.service.Jobs, built by create_app), and what
only the web adds to it: a transaction of its own for a button, and cursors for paging."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from flask import current_app, g
from sqlalchemy import Connection

from spacejobs.models.errors import InvalidRequest
from spacejobs.models.jobs.records import ALL_STATUSES, Job
from spacejobs.models.jobs.service import Jobs
from spacejobs.models.tenancy.access import Membership
from spacejobs.models.tenancy.accounts import User
from spacejobs.webapp.auth import org_transaction
from spacejobs.webapp.paging import decode_cursor, page_of

PAGE_SIZE = 50


def job_api() -> Jobs:
    """This process's job API: every view that touches a job acts through it."""
    jobs: Jobs = current_app.extensions["spacejobs.jobs"]
    return jobs


def start_job(org: str, user: User, kind_name: str, raw_params: Any, *,
              dedup_key: str | None = None) -> tuple[Job, bool]:
    """For the pages' buttons: a submit in a transaction of its own, by the API's rules."""
    with org_transaction(org, user) as (conn, membership):
        submitted = job_api().submit(conn, kind_name, raw_params,
                                     organization_id=membership.organization_id,
                                     requested_by=user.id, dedup_key=dedup_key,
                                     request_id=g.request_id)
    return submitted.job, submitted.created


def list_page(
    conn: Connection, membership: Membership, *, status: str | None, kind: str | None,
    cursor: str | None, limit: int = PAGE_SIZE,
) -> tuple[list[Job], str | None]:
    """Newest first, keyset pagination: the jobs and the cursor of the next (older) page."""
    if status is not None and status not in ALL_STATUSES:
        raise InvalidRequest("Unknown status filter.", fields=["status"])
    rows = job_api().page(conn, membership, status=status, kind=kind,
                          before=decode_cursor(cursor, UUID), limit=limit + 1)
    return page_of(rows, limit, lambda job: (job.created_at, job.id))
