"""The job store: one function per transition of a job's life, each around SQL in store.sql.

Nothing else changes ``jobs.status``. Every function takes the caller's connection, so the
caller decides the transaction (and its tenant scope); the transition trigger writes the
``job_events`` row in that same transaction.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from models.db.queries import queries_beside
from models.errors import DomainError, DuplicateJob, IdempotencyKeyReused, JobFinished, NotFound
from models.jobs.records import RUNNING, Job, LeasedJob
from models.kinds.rules import KindRules

Q = queries_beside(__file__)


# ---------------------------------------------------------------------------------------------
# Web side (space_app, transaction scoped to the organization)
# ---------------------------------------------------------------------------------------------

def submit(
    conn: Connection,
    *,
    organization_id: UUID,
    requested_by: UUID,
    kind: KindRules,
    params: dict[str, Any],
    dedup_key: str | None = None,
    idempotency_key: str | None = None,
    request_id: str | None = None,
) -> tuple[Job, bool]:
    """Insert a queued job. Returns ``(job, created)``; ``created`` is False for a replay.

    Raises DuplicateJob when an active job has the same dedup_key, IdempotencyKeyReused when the
    key was used for a different kind or params.
    """
    row = conn.execute(
        Q["submit"],
        {
            "organization_id": organization_id,
            "requested_by": requested_by,
            "kind": kind.name,
            "params": json.dumps(params),
            "max_attempts": kind.max_attempts,
            "lease_seconds": kind.lease_seconds,
            "dedup_key": dedup_key,
            "idempotency_key": idempotency_key,
            "request_id": request_id,
        },
    ).mappings().one_or_none()
    if row is not None:
        return Job.from_row(row), True
    if idempotency_key is not None:
        previous = conn.execute(
            Q["find_by_idempotency_key"],
            {"organization_id": organization_id, "requested_by": requested_by,
             "idempotency_key": idempotency_key},
        ).mappings().one_or_none()
        if previous is not None:
            if previous["kind"] != kind.name or previous["params"] != params:
                raise IdempotencyKeyReused()
            return Job.from_row(previous), False
    duplicate = conn.execute(
        Q["find_active_duplicate"],
        {"organization_id": organization_id, "kind": kind.name, "dedup_key": dedup_key},
    ).scalar_one_or_none()
    # The conflicting job may have finished between the INSERT and this SELECT: report the
    # duplicate only when we can name it, else the caller may simply submit again.
    raise DuplicateJob(job_id=str(duplicate) if duplicate else None)


def get(conn: Connection, job_id: UUID | str) -> Job | None:
    row = conn.execute(Q["get"], {"id": str(job_id)}).mappings().one_or_none()
    return Job.from_row(row) if row else None


def get_result(conn: Connection, job_id: UUID | str) -> tuple[Job, Any] | None:
    row = conn.execute(Q["get"], {"id": str(job_id)}).mappings().one_or_none()
    return (Job.from_row(row), row["result"]) if row else None


def list_for_org(
    conn: Connection,
    organization_id: UUID,
    *,
    status: str | None = None,
    kind: str | None = None,
    before: tuple[datetime, UUID] | None = None,
    limit: int = 50,
) -> list[Job]:
    rows = conn.execute(
        Q["list_for_org"],
        {
            "organization_id": organization_id,
            "status": status,
            "kind": kind,
            "before_created": before[0] if before else None,
            "before_id": before[1] if before else None,
            "limit": limit,
        },
    ).mappings()
    return [Job.from_row(row) for row in rows]


def request_cancel(conn: Connection, job_id: UUID | str, user_id: UUID) -> Job:
    """queued → cancelled at once; leased → cancel_requested. Terminal → JobFinished."""
    row = conn.execute(Q["request_cancel"], {"id": str(job_id), "user_id": user_id}).mappings()
    row = row.one_or_none()
    if row is not None:
        return Job.from_row(row)
    job = get(conn, job_id)
    if job is None:
        raise NotFound()
    if job.finished:
        raise JobFinished(status=job.status)
    return job  # already cancel_requested: asking twice changes nothing


# ---------------------------------------------------------------------------------------------
# Worker side (space_worker)
# ---------------------------------------------------------------------------------------------

def claim_controls(conn: Connection) -> list[Any]:
    """The operators' per-kind controls: (kind, paused, concurrency_limit) rows."""
    return list(conn.execute(Q["claim_controls"]).all())


def claim(conn: Connection, worker: str, *, controls: list[Any] | None = None) -> LeasedJob | None:
    """Lease the next due job (or one whose lease expired) with a fresh random token.

    Paused kinds are skipped. A kind with a concurrency limit is claimed under a per-kind
    advisory lock and given back (savepoint rollback) when it would exceed the limit; the next
    candidate of another kind is tried instead. ``controls`` lets a caller reuse recently read
    controls (the runner re-reads them every second) instead of one more query per claim.
    """
    if controls is None:
        controls = claim_controls(conn)
    skip = [c.kind for c in controls if c.paused]
    limits = {c.kind: c.concurrency_limit for c in controls if not c.paused}
    while True:
        leased = _claim_one(conn, worker, skip, undoable=bool(limits))
        if leased is None or leased[0].kind not in limits:
            return leased[0] if leased else None
        job, savepoint = leased
        conn.execute(Q["lock_kind"], {"kind": job.kind})
        running = conn.execute(Q["count_running"], {"kind": job.kind}).scalar_one()
        if running <= limits[job.kind]:
            savepoint.commit()
            return job
        savepoint.rollback()  # releases the row lock too: another worker may take it later
        skip.append(job.kind)


def _claim_one(
    conn: Connection, worker: str, skip: list[str], *, undoable: bool
) -> tuple[LeasedJob, Any] | None:
    """One claim attempt; inside a savepoint only when a limit may make us undo it (the common
    path without limits saves the two extra round trips)."""
    token = uuid.uuid4()
    for query in ("claim_queued", "claim_expired"):
        savepoint = conn.begin_nested() if undoable else None
        row = conn.execute(
            Q[query], {"lease_token": token, "worker": worker, "skip_kinds": skip}
        ).mappings().one_or_none()
        if row is None:
            if savepoint is not None:
                savepoint.rollback()
            continue
        job = LeasedJob(
            id=row["id"],
            organization_id=row["organization_id"],
            requested_by=row["requested_by"],
            kind=row["kind"],
            params=row["params"],
            attempt=row["attempts"],
            max_attempts=row["max_attempts"],
            lease_token=token,
            lease_seconds=row["lease_seconds"],
            request_id=row["request_id"],
        )
        return job, savepoint
    return None


def extend_lease(conn: Connection, job_id: UUID, token: UUID) -> str | None:
    """Heartbeat. Returns the job's status, or None when the lease is no longer ours."""
    return conn.execute(Q["extend_lease"], {"id": job_id, "lease_token": token}).scalar_one_or_none()


def record_progress(conn: Connection, job_id: UUID, token: UUID, progress_json: str) -> str | None:
    return conn.execute(
        Q["record_progress"], {"id": job_id, "lease_token": token, "progress": progress_json}
    ).scalar_one_or_none()


def lease_status(conn: Connection, job_id: UUID, token: UUID) -> str | None:
    status = conn.execute(Q["lease_status"], {"id": job_id, "lease_token": token}).scalar_one_or_none()
    return status if status in RUNNING else None


def lock_lease(conn: Connection, job_id: UUID, token: UUID) -> bool:
    return conn.execute(Q["lock_lease"], {"id": job_id, "lease_token": token}).first() is not None


def complete(conn: Connection, job_id: UUID, token: UUID, result: Any) -> bool:
    """The fenced finish. False: a newer attempt owns the job and this result is discarded."""
    row = conn.execute(
        Q["complete"],
        {"id": job_id, "lease_token": token, "result": json.dumps(result), "progress": None},
    ).first()
    return row is not None


def fail_attempt(
    conn: Connection, job_id: UUID, token: UUID, error: DomainError, *, retry_in: float
) -> str | None:
    """Record a failed attempt: retry, fail or (if asked) cancel. None: lease no longer ours."""
    return conn.execute(
        Q["fail_attempt"],
        {
            "id": job_id,
            "lease_token": token,
            "permanent": error.permanent,
            "retry_in": retry_in,
            "error_code": error.code,
            "error_message": error.message,
        },
    ).scalar_one_or_none()


def acknowledge_cancel(conn: Connection, job_id: UUID, token: UUID) -> bool:
    return conn.execute(Q["acknowledge_cancel"], {"id": job_id, "lease_token": token}).first() is not None


def release(conn: Connection, job_id: UUID, token: UUID) -> bool:
    """Give a job back without burning its attempt (graceful shutdown)."""
    return conn.execute(Q["release"], {"id": job_id, "lease_token": token}).first() is not None


def record_diagnostics(
    conn: Connection,
    job: LeasedJob,
    *,
    worker: str,
    exception_class: str,
    traceback: str,
) -> None:
    conn.execute(
        Q["record_diagnostics"],
        {
            "job_id": job.id,
            "organization_id": job.organization_id,
            "attempt": job.attempt,
            "worker": worker,
            "exception_class": exception_class,
            "traceback": traceback,
        },
    )


# ---------------------------------------------------------------------------------------------
# Sweeper (space_worker)
# ---------------------------------------------------------------------------------------------

def sweep_expired_leases(conn: Connection, *, batch: int = 500) -> list[tuple[UUID, str]]:
    """Expired leases → queued (attempts left), failed (none left) or cancelled (cancel asked)."""
    return [tuple(row) for row in conn.execute(Q["sweep_expired_leases"], {"batch": batch})]


def sweep_unsignalled(conn: Connection, *, grace: float, batch: int = 500) -> list[tuple[UUID, str]]:
    """Due jobs nobody claimed within ``grace`` seconds, marked as re-signalled now."""
    return [
        tuple(row) for row in conn.execute(Q["sweep_unsignalled"], {"grace": grace, "batch": batch})
    ]


def purge_finished(
    conn: Connection, *, jobs_age: float, results_age: float, events_age: float, batch: int = 1000
) -> dict[str, int]:
    """Retention (ages in seconds): delete finished jobs, drop old results, delete old events."""
    row = conn.execute(
        Q["purge_finished"],
        {"jobs_age": jobs_age, "results_age": results_age, "events_age": events_age, "batch": batch},
    ).mappings().one()
    return dict(row)


def fold_metrics(conn: Connection, *, batch: int = 10_000) -> int:
    """Fold recorded metric events into the counters (bounded); returns how many were folded."""
    return conn.execute(Q["fold_metrics"], {"batch": batch}).scalar_one()
