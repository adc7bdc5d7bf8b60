"""The Python API for application code, and the one path the web's views take too.

Every function takes the CALLER's connection and works inside the caller's open transaction::

    from models.jobs import service

    with engine.begin() as conn:                     # an engine from models.db.engine.make_engine
        order = create_order(conn, ...)              # the application's own writes
        job = service.submit(conn, "projects_export", {}, organization_id=org, requested_by=user)
    # COMMIT: the row and the order exist together, and only now does the wake-up go out.
    # A rollback writes neither and sends nothing.

``submit`` checks the requester's current membership and the organization's state against the
kind's rules and writes the row and its event, in one statement (submit_job() in the schema),
and registers the wake-up to be sent after COMMIT (the insert's NOTIFY is transactional too).
Domain errors (models.errors) say what was refused; nothing has been written when one is raised.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from models.db.transaction import after_commit
from models.errors import DomainError, DuplicateJob, InvalidRequest
from models.jobs import store
from models.jobs.records import Job
from models.kinds import JobKind, get_kind

#: how many jobs one bulk submit may carry
MAX_BATCH = 1000

Wake = Callable[[str | None], object]
_wake: Wake | None = None


def configure(wake: Wake | None) -> None:
    """Who sends the wake-up after a submit commits: the web and the workers install their
    publisher (tasks.wakeups.WakeupPublisher.wake) at start-up. Without one, jobs still run:
    lingering workers hear the insert's NOTIFY and the sweeper re-signals due jobs."""
    global _wake
    _wake = wake


@dataclass(frozen=True)
class Submitted:
    job: Job
    created: bool  # False: an Idempotency-Key replay answered with the first job


@dataclass(frozen=True)
class JobRequest:
    """One job of a bulk submit, as the caller asks for it (validated by :func:`submit_many`)."""

    kind: str
    params: dict[str, Any] | None = None
    dedup_key: str | None = None
    run_after: datetime | None = None


def submit(
    conn: Connection,
    kind: str,
    params: dict[str, Any] | None = None,
    *,
    organization_id: UUID,
    requested_by: UUID,
    dedup_key: str | None = None,
    idempotency_key: str | None = None,
    run_after: datetime | None = None,
    request_id: str | None = None,
    wake: Wake | None = None,
) -> Submitted:
    """Queue one job in the caller's transaction; the wake-up goes out after COMMIT.

    ``wake``: the publisher to use instead of the configured one (the web passes its own).
    """
    job_kind = get_kind(kind)
    valid = _validated(job_kind, params, dedup_key)
    job, created = store.submit(
        conn, organization_id=organization_id, requested_by=requested_by, kind=job_kind.rules,
        params=valid, dedup_key=dedup_key, idempotency_key=idempotency_key,
        request_id=request_id, run_after=run_after)
    if created:
        _wake_after_commit(conn, str(job.id), wake)
    return Submitted(job, created)


def submit_many(
    conn: Connection,
    requests: Sequence[JobRequest],
    *,
    organization_id: UUID,
    requested_by: UUID,
    request_id: str | None = None,
    wake: Wake | None = None,
) -> list[Job]:
    """Queue many jobs in one statement, all or nothing, in the caller's transaction.

    A refused item raises the same domain error a single submit would, with ``index`` (its
    place in ``requests``) in the error's details; nothing of the batch is then written.
    """
    if not 1 <= len(requests) <= MAX_BATCH:
        raise InvalidRequest(f"A batch holds 1 to {MAX_BATCH} jobs.", fields=["jobs"])
    new_jobs, seen_keys = [], {}
    for index, item in enumerate(requests):
        try:
            job_kind = get_kind(item.kind)
            valid = _validated(job_kind, item.params, item.dedup_key)
        except DomainError as error:
            error.details["index"] = index
            raise
        if item.dedup_key is not None:
            earlier = seen_keys.setdefault((item.kind, item.dedup_key), index)
            if earlier != index:
                raise DuplicateJob("The batch holds the same job twice.", index=index)
        new_jobs.append(store.NewJob(job_kind.rules, valid, item.dedup_key, item.run_after))
    # A savepoint: a conflict undoes the batch's rows, not the caller's own earlier writes.
    savepoint = conn.begin_nested()
    written = store.submit_many(conn, new_jobs, organization_id=organization_id,
                                requested_by=requested_by, request_id=request_id)
    if None in written:
        savepoint.rollback()
        index = written.index(None)
        item = requests[index]
        existing = store.find_active_duplicate(conn, organization_id, item.kind,
                                               item.dedup_key or "")
        raise DuplicateJob(index=index, job_id=str(existing) if existing else None)
    savepoint.commit()
    _wake_after_commit(conn, str(written[0].id), wake)  # type: ignore[union-attr]
    return written  # type: ignore[return-value]


def _validated(job_kind: JobKind, params: dict[str, Any] | None, dedup_key: str | None
               ) -> dict[str, Any]:
    if dedup_key is not None and not job_kind.rules.dedupable:
        raise InvalidRequest("This kind of job cannot be de-duplicated.", fields=["dedup_key"])
    return job_kind.parse_params(params).model_dump(mode="json")


def _wake_after_commit(conn: Connection, job_id: str, wake: Wake | None) -> None:
    publish = wake or _wake
    if publish is not None:
        after_commit(conn, lambda: publish(job_id))
