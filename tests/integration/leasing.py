"""One-job spellings of the store's batch calls, for tests that lease jobs by hand."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from spacejobs.models.jobs import store
from spacejobs.models.jobs.records import LeasedJob


def claim_one(conn: Connection, worker: str) -> LeasedJob | None:
    leased = store.claim_batch(conn, worker, limit=1)
    return leased[0] if leased else None


def complete_one(conn: Connection, job_id: UUID, token: UUID, result: Any) -> bool:
    return job_id in store.complete_batch(conn, [(job_id, token, result, None)])


def release_one(conn: Connection, job_id: UUID, token: UUID) -> bool:
    return job_id in store.release_batch(conn, [(job_id, token)])
