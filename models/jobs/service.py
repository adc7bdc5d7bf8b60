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

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, Engine

from models.db.roles import listen_url
from models.db.transaction import after_commit, scope, transaction
from models.errors import DomainError, DuplicateJob, InvalidRequest, NotFound
from models.jobs import store, waiting
from models.jobs.records import Job, Status
from models.kinds import JobKind, get_kind
from models.results.records import StoredResult
from models.tenancy import member_jobs
from models.tenancy.access import require_membership

#: how many jobs one bulk submit may carry
MAX_BATCH = 1000
#: a job's priority among its organization's due jobs (the jobs.priority CHECK says the same)
MIN_PRIORITY, MAX_PRIORITY = -10, 10

Wake = Callable[[str | None], object]
_wake: Wake | None = None
_engine: Engine | None = None


def configure(*, wake: Wake | None = None, engine: Engine | None = None) -> None:
    """Set up the API for this process.

    ``wake``: who sends the wake-up after a submit commits (tasks.wakeups.WakeupPublisher.wake;
    the web and the workers install theirs at start-up). Without one, jobs still run: lingering
    workers hear the insert's NOTIFY and the sweeper re-signals due jobs.
    ``engine``: the engine :func:`wait` reads with, as the web role (space_app), from
    models.db.engine.make_engine. The API acts as the web does: the worker role may not read
    results.
    """
    global _wake, _engine
    if wake is not None:
        _wake = wake
    if engine is not None:
        _engine = engine


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
    priority: int = 0


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
    priority: int = 0,
    request_id: str | None = None,
    wake: Wake | None = None,
) -> Submitted:
    """Queue one job in the caller's transaction; the wake-up goes out after COMMIT.

    ``run_after``: not before this moment. ``priority``: from -10 to 10, higher first among the
    organization's due jobs (organizations still take turns). ``wake``: the publisher to use
    instead of the configured one (the web passes its own).
    """
    job_kind = get_kind(kind)
    valid = _validated(job_kind, params, dedup_key, priority)
    job, created = store.submit(
        conn, organization_id=organization_id, requested_by=requested_by, kind=job_kind.rules,
        params=valid, dedup_key=dedup_key, idempotency_key=idempotency_key,
        request_id=request_id, run_after=run_after, priority=priority)
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
            valid = _validated(job_kind, item.params, item.dedup_key, item.priority)
        except DomainError as error:
            error.details["index"] = index
            raise
        if item.dedup_key is not None:
            earlier = seen_keys.setdefault((item.kind, item.dedup_key), index)
            if earlier != index:
                raise DuplicateJob("The batch holds the same job twice.", index=index)
        new_jobs.append(store.NewJob(job_kind.rules, valid, item.dedup_key, item.run_after,
                                     item.priority))
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


def get(conn: Connection, job_id: UUID, *, organization_id: UUID) -> Job | None:
    """The job, or None (also for another organization's job: tenants never see each other's)."""
    scope(conn, organization_id=organization_id)
    return store.get(conn, job_id)


def cancel(conn: Connection, job_id: UUID, *, organization_id: UUID, user_id: UUID,
           request_id: str | None = None) -> Job:
    """A queued job is cancelled at once; a running one is asked to stop (cancel_requested) and
    stops at its next safe point.

    The rule is the web's, from the same function (models.tenancy.member_jobs.cancel): the user
    must be a current member, and either the job's requester or holding the kind's role
    (InsufficientRole otherwise). JobFinished for a job that had already ended, NotFound for
    one that is not the organization's or a user who is not its member."""
    scope(conn, organization_id=organization_id, user_id=user_id, actor=f"user:{user_id}")
    membership = require_membership(conn, organization_id, user_id)
    return member_jobs.cancel(conn, membership, job_id, request_id)


def running(conn: Connection, *, organization_id: UUID, kind: str | None = None) -> list[Job]:
    """The organization's jobs someone runs now, oldest first (optionally of one kind)."""
    scope(conn, organization_id=organization_id)
    return store.running(conn, organization_id, kind=kind)


@dataclass(frozen=True)
class Outcome:
    """A job that ended, and its result (None unless it completed). A result in the results
    store is its descriptor here, and ``stored`` names the file (open it with the store)."""

    job: Job
    result: Any
    stored: StoredResult | None = None


def wait(job_id: UUID, timeout: float, *, organization_id: UUID,
         engine: Engine | None = None) -> Outcome:
    """Block until the job has ended, at most ``timeout`` seconds; TimeoutError after that.

    No polling: the finish NOTIFYs (models/jobs/waiting.py), and the row is read again only when
    it says so (and every few seconds, in case a notification was lost). Each read is its own
    short transaction, so no transaction stays open while waiting; any thread may wait (a Flask
    view, a Celery task). Behind a transaction-mode pooler without a direct URL to LISTEN on
    (models.db.roles.listen_url), it re-reads the row every ``waiting.RECHECK`` seconds.
    """
    engine = engine or _engine
    if engine is None:
        raise RuntimeError("wait() needs an engine: service.configure(engine=...) or engine=")
    finishes = waiting.listener(listen_url(engine.url.render_as_string(hide_password=False)))
    deadline = time.monotonic() + timeout
    finishes.ready(timeout)
    announced = finishes.register(job_id)
    try:
        while True:
            with transaction(engine, organization_id=organization_id) as conn:
                found = store.get_result(conn, job_id)
            if found is None:
                raise NotFound()
            job, result, ref = found
            if job.finished:
                if job.status != Status.COMPLETED:
                    return Outcome(job, None)
                return Outcome(job, result, StoredResult.from_row(ref, result) if ref else None)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"job {job_id} is still {job.status} after {timeout} s")
            announced.wait(min(left, waiting.RECHECK))
            announced.clear()
    finally:
        finishes.forget(job_id, announced)


def _validated(job_kind: JobKind, params: dict[str, Any] | None, dedup_key: str | None,
               priority: int = 0) -> dict[str, Any]:
    if not (isinstance(priority, int) and MIN_PRIORITY <= priority <= MAX_PRIORITY):
        raise InvalidRequest(f"The priority is a whole number from {MIN_PRIORITY} to {MAX_PRIORITY}.",
                             fields=["priority"])
    if dedup_key is not None and not job_kind.rules.dedupable:
        raise InvalidRequest("This kind of job cannot be de-duplicated.", fields=["dedup_key"])
    return job_kind.parse_params(params).model_dump(mode="json")


def _wake_after_commit(conn: Connection, job_id: str, wake: Wake | None) -> None:
    publish = wake or _wake
    if publish is not None:
        after_commit(conn, lambda: publish(job_id))
