"""The job store: one function per transition of a job's life, each around SQL in store.sql.

Nothing else changes ``jobs.status``. Every function takes the caller's connection, so the
caller decides the transaction (and its tenant scope); the transition trigger writes the
``job_events`` row in that same transaction.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, TypedDict
from uuid import UUID

from sqlalchemy import Connection, RowMapping

from spacejobs.models import tracing
from spacejobs.models.db import hot
from spacejobs.models.db.queries import queries_beside
from spacejobs.models.diagnostics import Diagnosis
from spacejobs.models.errors import (
    DomainError,
    DuplicateJob,
    IdempotencyKeyReused,
    JobFinished,
    LeaseLost,
    NotFound,
    OrganizationUnavailable,
    TooManyJobs,
)
from spacejobs.models.jobs.records import RUNNING, Job, KindControl, LeasedJob, Status
from spacejobs.models.kinds.registry import registered_kinds
from spacejobs.models.kinds.rules import KindRules
from spacejobs.models.tenancy.access import ROLE_RANK, cancel_refused, check_allowed

Q = queries_beside(__file__)


# ---------------------------------------------------------------------------------------------
# Web side (space_app, transaction scoped to the organization)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NewJob:
    """One job of a submit, validated: a single submit is a batch of one of these."""

    kind: KindRules
    params: dict[str, Any]
    dedup_key: str | None = None
    run_after: datetime | None = None
    priority: int = 0
    sequence_key: str | None = None
    #: with ``dedup_key``: while a job of the key is queued and has not started, take its
    #: place (its params, its start this many seconds from now) instead of a new job
    debounce_seconds: int | None = None
    #: the rules of the jobs it will start (a workflow's steps and failure handler, already in
    #: ``kind``'s), each by its place, so that a refusal names the part whose own rules refuse
    parts: Sequence[tuple[int | str, KindRules]] = ()


class Written(NamedTuple):
    """What a submit did with one job of its request: ``outcome`` is ``created``;
    ``debounced`` (a queued job of the dedup key that never started took these params and now
    starts ``debounce_seconds`` from now: ``job`` is that job); or ``replayed`` (an
    Idempotency-Key seen before: ``job`` is the first one)."""

    job: Job
    outcome: str


def submit(
    conn: Connection,
    jobs: Sequence[NewJob],
    *,
    organization_id: UUID,
    requested_by: UUID,
    request_id: str | None = None,
    idempotency_key: str | None = None,
    retry_of: UUID | None = None,
    bulk: bool = False,
) -> list[Written]:
    """Insert queued jobs in one statement, after checking the requester's current standing
    against every kind's rules; one job is a batch of one. Returns what was done with each job,
    in the order given.

    Raises the domain error that says why the requester may not (NotFound for a non-member,
    as for any other organization), TooManyJobs when the organization's quota of active jobs
    (or a kind's) is full, DuplicateJob when an active job has the same dedup_key,
    IdempotencyKeyReused when ``idempotency_key`` (a batch of one) was used for a different
    kind or params. A refusal names the first job whose own rules refuse (``index``, for a
    ``bulk`` request) and, for a workflow, its first step that does (``step``). Nothing is
    written when TooManyJobs or a refusal is raised; after a DuplicateJob, the other jobs of a
    batch ARE written: the caller rolls them back (all or nothing).
    """
    ids = [uuid.uuid4() for _ in jobs]
    sequence_keys = [j.sequence_key for j in jobs]
    debounces = [j.debounce_seconds for j in jobs]
    rows = hot.rows(conn, Q["submit"], {
        "organization_id": organization_id, "requested_by": requested_by,
        "org_states": sorted(frozenset.intersection(*(j.kind.org_states for j in jobs))),
        "role": max((j.kind.role for j in jobs), key=lambda r: ROLE_RANK[r]),
        "request_id": request_id, "ids": ids,
        "kinds": [j.kind.name for j in jobs], "params": [json.dumps(j.params) for j in jobs],
        "max_attempts": [j.kind.max_attempts for j in jobs],
        "lease_seconds": [j.kind.lease_seconds for j in jobs],
        "dedup_keys": [j.dedup_key for j in jobs], "run_afters": [j.run_after for j in jobs],
        "kind_quotas": [j.kind.quota for j in jobs], "priorities": [j.priority for j in jobs],
        "traceparent": tracing.current_traceparent(),
        # NULL when no job has one: the function then skips what they ask for
        "sequence_keys": sequence_keys if any(k is not None for k in sequence_keys) else None,
        "debounce_seconds": debounces if any(d is not None for d in debounces) else None,
        "idempotency_key": idempotency_key, "retry_of": retry_of, "bulk": bulk,
        **_declared_quotas(),
    }, as_dicts=True)
    first = rows[0] if rows else None
    if first is not None and first["outcome"] == "refused":
        _raise_refusal(first, jobs, bulk)
    if first is not None and first["outcome"] == "over_quota":
        _raise_over_quota(first)
    written: list[Written | None] = [None] * len(jobs)
    for row in rows:
        index = row["request_place"] - 1
        if row["outcome"] == "duplicate":
            raise (DuplicateJob(index=index, job_id=str(row["id"]) if row["id"] else None) if bulk
                   else DuplicateJob(job_id=str(row["id"]) if row["id"] else None))
        if row["outcome"] == "replayed" and (row["kind"] != jobs[index].kind.name
                                             or row["params"] != jobs[index].params):
            raise IdempotencyKeyReused()
        written[index] = Written(Job.from_row(row), row["outcome"])
    if None in written:
        raise RuntimeError("submit_jobs() left a job of the request unanswered")
    return [w for w in written if w is not None]


def _declared_quotas() -> dict[str, list[Any]]:
    """The caps the kinds of this process declare (``quota=``), as the submit functions take
    them for the children a job will make (a workflow's steps): the database picks those of the
    kinds it finds in the workflow. Read once per set of kinds, as the rate limits are."""
    kinds, caps = _quotas_of(len(registered_kinds()))
    return {"quota_kinds": kinds, "quota_caps": caps}


@functools.lru_cache(maxsize=4)
def _quotas_of(_kind_count: int) -> tuple[list[str], list[int]]:
    declared = sorted((name, kind.rules.quota) for name, kind in registered_kinds().items()
                      if kind.rules.quota is not None)
    return [name for name, _ in declared], [cap for _, cap in declared]


def _standing(row: Any) -> Standing | None:
    """The requester's standing as the database read it for a refused submit."""
    if row["member_role"] is None:
        return None
    return Standing(row["member_role"], row["member_organization_state"])


def _raise_refusal(row: Any, jobs: Sequence[NewJob], bulk: bool) -> None:
    """The database checked the strictest rules of the request at once: name the first job
    whose own rules refuse, with its own reason (a member's export passes where their import
    does not), and its ``index`` in a bulk request."""
    standing = _standing(row)
    for index, job in enumerate(jobs):
        try:
            _check_parts(standing, job.parts)
            check_allowed(standing, org_states=job.kind.org_states, role=job.kind.role)
        except DomainError as refusal:
            if bulk:
                refusal.details["index"] = index
            raise
    raise OrganizationUnavailable()  # the database refused on rules we could not see: be safe


def _check_parts(standing: Standing | None, parts: Sequence[tuple[int | str, KindRules]]) -> None:
    """The refusal of the first part (a workflow's step, or its failure handler) whose own rules
    refuse the requester, naming its place (``step``); nothing for a requester who is not a
    member (the whole submit is refused alike)."""
    if standing is None:
        return
    for place, part in parts:
        try:
            check_allowed(standing, org_states=part.org_states, role=part.role)
        except DomainError as refusal:
            refusal.details["step"] = place
            raise


def _raise_over_quota(row: Any) -> None:
    limit, kind = row["quota_limit"], row["quota_kind"]
    whose = f"active {kind} jobs" if kind else "active jobs"
    raise TooManyJobs(f"This organization has reached its limit of {limit} {whose}; "
                      "try again when some have finished.", limit=limit,
                      retry_after=TooManyJobs.retry_after)


def get(conn: Connection, job_id: UUID | str) -> Job | None:
    row = conn.execute(Q["get"], {"id": str(job_id)}).mappings().one_or_none()
    return Job.from_row(row) if row else None


def request_id_of(conn: Connection, job_id: UUID) -> str | None:
    found: str | None = conn.execute(Q["request_id_of"], {"id": job_id}).scalar_one_or_none()
    return found


def snapshot(conn: Connection, job_id: UUID) -> RowMapping:
    """The row's organization, status, requester, kind and params (NotFound if none)."""
    row = conn.execute(Q["snapshot"], {"id": job_id}).mappings().one_or_none()
    if row is None:
        raise NotFound()
    return row


@dataclass(frozen=True)
class ResultRow:
    """A job with its result, as a result read sees it."""

    job: Job
    result: Any
    #: the key of a stored result in the results store, else None
    ref: str | None
    #: the least role a member needs to read the result (the strictest of what a parent
    #: holds); None when the read asked for no roles
    role_needed: str | None


def role_needed(conn: Connection, job_id: UUID, kind_roles: Mapping[str, str]) -> str | None:
    """The least role a member needs to act on the job (cancel, signal, read its result): its
    kind's, and for a parent the strictest of every kind within it (job_role_needed() in the
    schema). None for a job the caller's organization does not hold."""
    needed: str | None = conn.execute(Q["role_needed"], {
        "id": job_id, "kind_roles": json.dumps(dict(kind_roles))}).scalar_one()
    return needed


def get_result(conn: Connection, job_id: UUID | str, *,
               kind_roles: Mapping[str, str] | None = None) -> ResultRow | None:
    """The job, its result and its ``result_ref``; with ``kind_roles`` (kind -> role, from the
    registry), also the role reading it needs (job_role_needed() in the schema)."""
    row = conn.execute(Q["get_result"], {
        "id": str(job_id),
        "kind_roles": json.dumps(dict(kind_roles)) if kind_roles is not None else None,
    }).mappings().one_or_none()
    if row is None:
        return None
    return ResultRow(Job.from_row(row), row["result"], row["result_ref"], row["role_needed"])


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


def running(conn: Connection, organization_id: UUID, *, kind: str | None = None) -> list[Job]:
    rows = conn.execute(Q["running"], {"organization_id": organization_id, "kind": kind}).mappings()
    return [Job.from_row(row) for row in rows]


def request_cancel(conn: Connection, job_id: UUID | str, user_id: UUID,
                   request_id: str | None = None, *, kind_roles: Mapping[str, str] | None = None,
                   as_operator: bool = False) -> Job:
    """queued → cancelled at once; leased → cancel_requested. Terminal → JobFinished.

    The statement applies the one rule for every cancel: ``user_id`` is an operator (with
    ``as_operator``), or a current member who started the job or holds the role its kind needs
    (``kind_roles``: kind → role, from the registry; a kind missing from it needs an owner).
    InsufficientRole when the rule refuses. A cancel that changed the job is written to the
    organization's audit log as ``user_id``'s (with the transaction's actor: a member's or an
    operator's), in the same statement."""
    roles = dict(kind_roles or {})
    # The job's row (after its children's) first, in a statement of its own: whatever makes
    # its children holds it (start_fan_out(), start_workflow(), a child's end through the jobs
    # trigger), so that commits before the cancel's statement takes its snapshot, and the
    # cancel sees, and cancels, every child made before it took effect.
    conn.execute(Q["lock_for_cancel"], {"id": str(job_id)})
    row = conn.execute(Q["request_cancel"], {
        "id": str(job_id), "user_id": user_id, "request_id": request_id,
        "kind_roles": json.dumps(roles), "as_operator": as_operator}).mappings().one_or_none()
    if row is not None:
        return Job.from_row(row)
    job = get(conn, job_id)
    if job is None:
        raise NotFound()
    if job.finished:
        raise JobFinished(status=job.status)
    if job.status == Status.CANCEL_REQUESTED:
        return job  # asking twice changes nothing
    raise cancel_refused(roles.get(job.kind, "owner"))


@dataclass(frozen=True)
class Resumed:
    """What resume_workflow() answered: ``resumed`` (``reused`` places of the old run), or why
    not: ``not_found``, ``refused``, ``not_resumable`` (``status``), ``already_resumed``
    (``resumed_as``)."""

    outcome: str
    status: Status | None
    reused: int
    resumed_as: UUID | None


def resumed_as(conn: Connection, job_id: UUID) -> UUID | None:
    """The job that resumed (or retried) this one, if any: the caller's organization's rows."""
    found: UUID | None = conn.execute(Q["resumed_as"], {"id": job_id}).scalar_one_or_none()
    return found


def resume_workflow(conn: Connection, old: UUID, new: UUID, user_id: UUID,
                    request_id: str | None, *, kind_roles: Mapping[str, str]) -> Resumed:
    """Make ``new`` (this transaction's submit of ``old``'s params, retry_of ``old``) the resume
    of the failed or cancelled workflow ``old``: the places ``old`` completed are reused, under
    the rule of the cancel, with the audit row (resume_workflow() in the schema)."""
    row = conn.execute(Q["resume_workflow"], {
        "old": old, "new": new, "user_id": user_id, "request_id": request_id,
        "kind_roles": json.dumps(dict(kind_roles))}).one()
    return Resumed(row.outcome, Status(row.status) if row.status else None, row.reused,
                   row.resumed_as)


# ---------------------------------------------------------------------------------------------
# Worker side (space_worker)
# ---------------------------------------------------------------------------------------------

def claim_controls(conn: Connection) -> list[KindControl]:
    """The operators' per-kind controls: the kinds paused or limited."""
    return [KindControl(*row) for row in conn.execute(Q["claim_controls"])]


@dataclass(frozen=True)
class Standing:
    """The requester's membership role and the organization's state, for a held job."""

    role: str
    organization_state: str


NO_ORGANIZATION = UUID(int=0)


def claim_batch(
    conn: Connection, worker: str, *, limit: int, controls: list[KindControl] | None = None,
    after_organization: UUID = NO_ORGANIZATION,
) -> Claimed:
    """Lease up to ``limit`` due jobs (or jobs whose lease expired), each with its own token.

    Paused kinds are skipped. A kind with a concurrency limit is claimed under a per-kind
    advisory lock, and only as many as its limit leaves room for, counting every job of that
    kind already leased anywhere (held in a batch or running): a batch never exceeds a limit.
    ``controls`` lets a caller reuse recently read controls (the runner re-reads them every
    second) instead of one more query per claim.

    Rate limits (a kind's declared ``rate_limit``, the operators' per organization) and
    sequences are applied by claim_jobs() itself; ``window_opens_at`` says when a full window
    next lets a job it held back start.
    """
    if controls is None:
        controls = claim_controls(conn)
    paused = [c.kind for c in controls if c.paused]
    limited = {c.kind: c.concurrency_limit for c in controls
               if not c.paused and c.concurrency_limit is not None}
    leased = Claimed()
    windows: list[datetime] = []
    for kind, cap in limited.items():
        if len(leased) >= limit:
            break
        conn.execute(Q["lock_kind"], {"kind": kind})
        room = cap - conn.execute(Q["count_running"], {"kind": kind}).scalar_one()
        if room > 0:
            some = _claim(conn, worker, limit=min(room, limit - len(leased)), only_kind=kind,
                          after_organization=after_organization)
            leased += some
            windows += [some.window_opens_at] if some.window_opens_at else []
    if len(leased) < limit:
        rest = _claim(conn, worker, limit=limit - len(leased), skip=paused + list(limited),
                      after_organization=after_organization)
        leased += rest
        leased.more_due, leased.next_organization = rest.more_due, rest.next_organization
        windows += [rest.window_opens_at] if rest.window_opens_at else []
    leased.window_opens_at = min(windows, default=None)
    return leased


def traceparents(conn: Connection, job_ids: Sequence[UUID]) -> dict[UUID, str]:
    """The trace context each of these jobs was submitted in (missing: none was stored)."""
    return {row.id: row.traceparent for row in conn.execute(Q["traceparents"], {"ids": list(job_ids)})}


class Claimed(list[LeasedJob]):
    """The jobs a claim leased, whether more were due than it took, and where the next claim's
    turn among the organizations starts."""

    more_due: bool = False
    next_organization: UUID = UUID(int=0)
    #: the soonest a full rate-limit window lets one of the jobs it held back start
    window_opens_at: datetime | None = None


def declared_rate_limits() -> tuple[list[str], list[int], list[int]]:
    """The rate limits this process's kinds declare, as claim_jobs() takes them: read from the
    registry once per set of kinds (kinds register at import), not at every claim."""
    return _rate_limits_of(len(registered_kinds()))


@functools.lru_cache(maxsize=4)
def _rate_limits_of(_kind_count: int) -> tuple[list[str], list[int], list[int]]:
    names, starts, windows = [], [], []
    for name, kind in sorted(registered_kinds().items()):
        if kind.rules.rate_limit is not None:
            names.append(name)
            starts.append(kind.rules.rate_limit.max_starts)
            windows.append(kind.rules.rate_limit.per_seconds)
    return names, starts, windows


def _claim(conn: Connection, worker: str, *, limit: int, skip: list[str] | None = None,
           only_kind: str | None = None, after_organization: UUID) -> Claimed:
    rate_kinds, rate_max, rate_seconds = declared_rate_limits()
    answer = hot.rows(conn, Q["claim_batch"], {
        "worker": worker, "limit": limit, "skip_kinds": skip or [], "only_kind": only_kind,
        "after_organization": after_organization, "rate_kinds": rate_kinds,
        "rate_max": rate_max, "rate_seconds": rate_seconds})
    rows = [row for row in answer if row.id is not None]  # an empty claim answers one row
    claimed = Claimed(
        LeasedJob(id=row.id, organization_id=row.organization_id, requested_by=row.requested_by,
                  kind=row.kind, params=row.params, attempt=row.attempts,
                  max_attempts=row.max_attempts, lease_token=row.lease_token,
                  lease_seconds=row.lease_seconds, request_id=row.request_id)
        for row in rows)
    claimed.more_due = any(row.more_due for row in answer)
    claimed.window_opens_at = min((row.window_opens_at for row in answer
                                   if row.window_opens_at is not None), default=None)
    claimed.next_organization = next_in_ring(after_organization,
                                             {job.organization_id for job in claimed})
    return claimed


def next_in_ring(after: UUID, served: set[UUID]) -> UUID:
    """Where the next claim starts: after the last organization this one served, going round
    the ring of organization ids from ``after`` (so every organization gets its turn)."""
    if not served:
        return after
    later = [org for org in served if org > after]
    return max(later) if later else max(served)


def extend_leases(conn: Connection, leases: Sequence[tuple[UUID, UUID]]) -> dict[UUID, Status]:
    """Heartbeat for every (job id, token) held: the status of each lease still ours; a job
    missing from the answer was lost (expired and taken by a newer attempt, or ended)."""
    if not leases:
        return {}
    rows = conn.execute(Q["extend_leases"], _lease_arrays(leases))
    return {row.id: Status(row.status) for row in rows}


def lease_standing(conn: Connection, leases: Sequence[tuple[UUID, UUID]]) -> dict[UUID, Standing]:
    """The requester's standing for each held job, locked (FOR SHARE) until this transaction
    ends, so a removal or a state change cannot slip in between the check and the write. A job
    missing from the answer has no membership left, or its lease is no longer ours."""
    if not leases:
        return {}
    rows = hot.rows(conn, Q["lease_standing"], _lease_arrays(leases))
    return {row.job_id: Standing(row.role, row.organization_state) for row in rows}


def complete_batch(conn: Connection,
                   completions: Sequence[tuple[UUID, UUID, Any, str | None]]) -> set[UUID]:
    """The fenced finish of many jobs: (job id, token, result, result_ref) each, ``result_ref``
    naming a file already in the results store (or None). Returns the ids completed; the
    others' tokens no longer match (a newer attempt owns them) and their results are
    discarded."""
    if not completions:
        return set()
    rows = hot.rows(conn, Q["complete_batch"], {
        "ids": [c[0] for c in completions],
        "tokens": [c[1] for c in completions],
        "results": [json.dumps(c[2]) for c in completions],
        "refs": [c[3] for c in completions],
    })
    return {row.id for row in rows}


def cancels_asked(conn: Connection, job_ids: Sequence[UUID]) -> set[UUID]:
    """Which of these jobs were asked to cancel (a read of their status, no lease needed)."""
    return {row.id for row in conn.execute(Q["cancels_asked"], {"ids": list(job_ids)})}


def release_batch(conn: Connection, leases: Sequence[tuple[UUID, UUID]]) -> set[UUID]:
    """Give jobs back without burning their attempt (graceful shutdown, or held unstarted behind
    a long job), waking the processes that listen; returns those given back."""
    if not leases:
        return set()
    return {row.id for row in conn.execute(Q["release_batch"], _lease_arrays(leases))}


def _lease_arrays(leases: Sequence[tuple[UUID, UUID]]) -> dict[str, list[UUID]]:
    return {"ids": [job_id for job_id, _ in leases], "tokens": [token for _, token in leases]}


def record_progress(conn: Connection, job_id: UUID, token: UUID, progress: dict[str, Any]) -> Status | None:
    """Measured progress, fenced; None when the lease is no longer ours."""
    status = conn.execute(
        Q["record_progress"], {"id": job_id, "lease_token": token, "progress": json.dumps(progress)}
    ).scalar_one()
    return Status(status) if status is not None else None


def lease_status(conn: Connection, job_id: UUID, token: UUID) -> Status | None:
    """The job's status while the lease is ours, else None."""
    status = conn.execute(Q["lease_status"], {"id": job_id, "lease_token": token}).scalar_one()
    return Status(status) if status in RUNNING else None


def lock_lease(conn: Connection, job_id: UUID, token: UUID) -> bool:
    """Lock the job's row until this transaction ends, if the token still holds its lease."""
    held: bool = conn.execute(Q["lock_lease"], {"id": job_id, "lease_token": token}).scalar_one()
    return held


def fail_attempt(
    conn: Connection, job_id: UUID, token: UUID, error: DomainError, *, retry_in: float,
    worker: str | None = None, diagnosis: Diagnosis | None = None,
) -> str | None:
    """Record a failed attempt: retry, fail or (if asked) cancel, with the operators' diagnosis
    of an unexpected exception (never its message). None: lease no longer ours."""
    return conn.execute(
        Q["fail_attempt"],
        {
            "id": job_id,
            "lease_token": token,
            "permanent": error.permanent,
            "retry_in": retry_in,
            "error_code": error.code,
            "error_message": error.message,
            "worker": worker,
            "exception_class": diagnosis.exception_class if diagnosis else None,
            "traceback": diagnosis.traceback if diagnosis else None,
        },
    ).scalar_one_or_none()


def acknowledge_cancel(conn: Connection, job_id: UUID, token: UUID) -> bool:
    acknowledged: bool = conn.execute(Q["acknowledge_cancel"],
                                      {"id": job_id, "lease_token": token}).scalar_one()
    return acknowledged


@dataclass(frozen=True)
class Child:
    """A child job of a fan-out, as its parent sees it."""

    index: int
    id: UUID
    status: Status
    result: Any
    error_code: str | None
    error_message: str | None


@dataclass(frozen=True)
class FanOut:
    """A fan-out the database runs for its parent (70_fan_out.sql): how many children in all,
    how many made so far, how many of those have ended."""

    total: int
    released: int
    ended: int

    @property
    def done(self) -> bool:
        return self.ended >= self.total


def fan_out_state(conn: Connection, parent: LeasedJob) -> FanOut | None:
    """The parent's fan-out (None: not started); LeaseLost when the lease is not the caller's."""
    row = conn.execute(Q["fan_out_state"], {"parent": parent.id,
                                            "token": parent.lease_token}).one_or_none()
    if row is None:
        raise LeaseLost()
    return None if row.total is None else FanOut(row.total, row.released, row.ended)


def start_fan_out(conn: Connection, parent: LeasedJob, kind: KindRules,
                  items: Sequence[dict[str, Any]], max_parallel: int) -> FanOut | None:
    """Record the parent's fan-out of ``kind`` over ``items`` and release its first children
    (one started before is left as it is); None when the lease is no longer the caller's or a
    cancel was asked for."""
    row = conn.execute(Q["start_fan_out"], {
        "parent": parent.id, "token": parent.lease_token, "kind": kind.name,
        "params": [json.dumps(item) for item in items], "max_parallel": max_parallel,
        "max_attempts": kind.max_attempts, "lease_seconds": kind.lease_seconds,
        "kind_quota": kind.quota}).one_or_none()
    if row is None:
        return None
    _refuse_children_over_quota(row)
    return FanOut(row.total, row.released, row.ended)


@dataclass(frozen=True)
class WorkflowState:
    """A workflow the database runs for its parent (70_fan_out.sql): its steps in all, how
    many made so far, how many of those ended, and how many of those did not complete."""

    total: int
    released: int
    ended: int
    failed: int

    @property
    def active(self) -> int:
        return self.released - self.ended


@dataclass(frozen=True)
class StepPlan:
    """One step of a workflow to start: its kind's rules, its params, the places whose results
    it reads and the places it only runs after (canvas.StepNode)."""

    kind: KindRules
    params: dict[str, Any]
    after: list[int]
    waits: list[int] = field(default_factory=list)


def workflow_state(conn: Connection, parent: LeasedJob) -> WorkflowState | None:
    """The parent's workflow (None: not started); LeaseLost when the lease is not the caller's."""
    row = conn.execute(Q["workflow_state"], {"parent": parent.id,
                                             "token": parent.lease_token}).one_or_none()
    if row is None:
        raise LeaseLost()
    return None if row.total is None else WorkflowState(row.total, row.released, row.ended,
                                                        row.failed)


def start_workflow(conn: Connection, parent: LeasedJob, steps: Sequence[StepPlan],
                   policy: str, max_parallel: int | None = None) -> WorkflowState | None:
    """Record the parent's workflow (at most ``max_parallel`` steps unfinished at a time, when
    given) and make the steps ready at once (one started before is left as it is); None when
    the lease is no longer the caller's or a cancel was asked for."""
    row = conn.execute(Q["start_workflow"], {
        "parent": parent.id, "token": parent.lease_token, "policy": policy,
        "max_parallel": max_parallel,
        "kinds": [step.kind.name for step in steps],
        "params": [json.dumps(step.params) for step in steps],
        "after": [json.dumps(step.after) for step in steps],
        "waits": [json.dumps(step.waits) for step in steps],
        "max_attempts": [step.kind.max_attempts for step in steps],
        "lease_seconds": [step.kind.lease_seconds for step in steps],
        "quotas": [step.kind.quota for step in steps]}).one_or_none()
    if row is None:
        return None
    _refuse_children_over_quota(row)
    return WorkflowState(row.total, row.released, row.ended, row.failed)


def _refuse_children_over_quota(row: Any) -> None:
    """A parent's children refused by a cap (start_fan_out(), start_workflow()): the parent's
    attempt fails with too_many_jobs, and is retried later, when jobs have finished."""
    if row.refused_kind is None:
        return
    whose = f"active {row.refused_kind} jobs" if row.refused_kind else "active jobs"
    raise TooManyJobs(f"Its parts would take this organization past its limit of {row.cap} "
                      f"{whose}; it will try again when some have finished.", permanent=False,
                      limit=row.cap)


def step_inputs(conn: Connection, step: LeasedJob) -> list[Any]:
    """The results of the steps a held workflow step waited for, in the order of its
    dependencies (step_inputs() in the schema); LeaseLost when the lease is no longer ours."""
    row = conn.execute(Q["step_inputs"], {"id": step.id, "token": step.lease_token}).one()
    if not row.held:
        raise LeaseLost()
    inputs: list[Any] = row.inputs
    return inputs


def children(conn: Connection, parent: LeasedJob) -> list[Child]:
    rows = conn.execute(Q["children_of"], {"parent": parent.id, "token": parent.lease_token})
    return [Child(r.child_index, r.id, Status(r.status), r.result, r.error_code, r.error_message)
            for r in rows]


def start_failure_handler(conn: Connection, workflow: LeasedJob, failure: Mapping[str, Any],
                          handler: KindRules) -> UUID | None:
    """Make the held workflow's failure handler, once (start_failure_handler() in the schema):
    the kind and params its submit declared, with ``failure`` as its first input. None when
    the lease is no longer ours or it declared none."""
    made: UUID | None = conn.execute(Q["start_failure_handler"], {
        "workflow": workflow.id, "token": workflow.lease_token, "failure": json.dumps(failure),
        "max_attempts": handler.max_attempts, "lease_seconds": handler.lease_seconds,
    }).scalar_one()
    return made


def cancel_children(conn: Connection, parent: LeasedJob) -> int:
    cancelled: int = conn.execute(Q["cancel_children"], {"parent": parent.id,
                                                         "token": parent.lease_token}).scalar_one()
    return cancelled


@dataclass(frozen=True)
class Step:
    """One of a parent job's children as its page lists it: its place, its name (a workflow's
    step; None for a fan-out's part), its kind, and the child job's id, status, attempts and
    error code; ``job_id`` and ``status`` are None for a workflow's step that is no job yet."""

    place: int
    name: str | None
    kind: str
    job_id: UUID | None
    status: Status | None
    attempts: int
    error_code: str | None


@dataclass(frozen=True)
class Steps:
    """The first of a parent's steps, in place order, and how many it has in all."""

    rows: list[Step]
    total: int

    @property
    def more(self) -> int:
        """How many there are beyond those listed."""
        return max(0, self.total - len(self.rows))


def steps_of(conn: Connection, parent_id: UUID, *, limit: int, after: int = -1) -> Steps:
    """At most ``limit`` of the parent's steps (a workflow's) or children (any other parent's,
    with the places its plan holds that are not jobs yet), in place order after the place
    ``after``, in ONE statement; none for a job that has none, or that the caller's organization
    does not hold (row-level security)."""
    rows = conn.execute(Q["steps_of"], {"parent": parent_id, "limit": limit,
                                        "after": after}).all()
    return Steps([Step(row.place, row.name, row.kind, row.id,
                       Status(row.status) if row.status else None, row.attempts or 0,
                       row.error_code) for row in rows],
                 int(rows[0].total) if rows else 0)


@dataclass(frozen=True)
class StepResult:
    """A completed step's result, as its parent's partial results list it: its place, its name
    (a workflow's step; None for a fan-out's part), its job, and the result (None once
    retention dropped it: ``expired``). A stored result is its descriptor; the step's own
    result read serves the file."""

    place: int
    name: str | None
    job_id: UUID
    kind: str
    result: Any
    expired: bool


def step_results(conn: Connection, parent_id: UUID, *, limit: int,
                 after: int = -1) -> list[StepResult]:
    """The results of at most ``limit`` of the parent's completed steps, in place order after
    the place ``after``. The caller has checked that the member may read the parent's result
    (:meth:`models.jobs.service.Jobs.step_results`); row-level security keeps it to the
    caller's organization."""
    rows = conn.execute(Q["step_results"], {"parent": parent_id, "limit": limit,
                                            "after": after}).all()
    return [StepResult(row.place, row.name, row.id, row.kind, row.result,
                       row.result_expired_at is not None) for row in rows]


# ---------------------------------------------------------------------------------------------
# Sweeper (space_worker)
# ---------------------------------------------------------------------------------------------

def sweep_expired_leases(conn: Connection, *, batch: int = 500,
                         from_at: datetime | None = None) -> list[tuple[UUID, str]]:
    """Expired leases → queued (attempts left), failed (none left) or cancelled (cancel asked):
    those that ran out from ``from_at`` on (None: every one)."""
    return [tuple(row) for row in conn.execute(Q["sweep_expired_leases"],
                                               {"batch": batch, "from_at": from_at})]


def expired_leases_horizon(conn: Connection, *, from_at: datetime | None) -> datetime:
    """Where the next sweep of expired leases may start, after one from ``from_at``: before it,
    no lease held now or taken later runs out."""
    horizon: datetime = conn.execute(Q["expired_leases_horizon"], {"from_at": from_at}).scalar_one()
    return horizon


def sweep_unsignalled(conn: Connection, *, grace: float, batch: int = 500) -> list[tuple[UUID, str]]:
    """Due jobs nobody claimed within ``grace`` seconds, marked as re-signalled now."""
    return [
        tuple(row) for row in conn.execute(Q["sweep_unsignalled"], {"grace": grace, "batch": batch})
    ]


@dataclass(frozen=True)
class RetentionHorizons:
    """Where each step of retention may start, by finish time: before it, the step took every
    job it may take (None: from the first). purge_finished_jobs() answers the next ones."""

    jobs: datetime | None = None
    results: datetime | None = None
    events: datetime | None = None


class Purged(TypedDict):
    """What one retention pass removed (purge_finished_jobs(), models/db/schema/80_retention.sql)."""

    jobs_deleted: int
    results_dropped: int
    events_deleted: int
    #: the results store's keys of the files those jobs and results held
    dropped_refs: list[str]
    #: where the next pass may start
    horizons: RetentionHorizons


def purge_finished(conn: Connection, *, batch: int = 1000,
                   horizons: RetentionHorizons | None = None) -> Purged:
    """Retention: delete finished jobs, drop old results, delete old events, each past the age
    the database's policy holds (models/ops/retention.py), each from its horizon (None: every
    step from the first job); at most ``batch`` of each.

    ``dropped_refs`` lists the stored files of the jobs and results it dropped: the caller
    deletes them once this transaction has committed (the orphan sweep does, should it not)."""
    start = horizons or RetentionHorizons()
    row = conn.execute(Q["purge_finished"], {
        "batch": batch, "jobs_from": start.jobs, "results_from": start.results,
        "events_from": start.events}).mappings().one()
    return Purged(jobs_deleted=row["jobs_deleted"], results_dropped=row["results_dropped"],
                  events_deleted=row["events_deleted"], dropped_refs=row["dropped_refs"],
                  horizons=RetentionHorizons(jobs=row["jobs_from"], results=row["results_from"],
                                             events=row["events_from"]))


@dataclass(frozen=True)
class Folded:
    """One fold of metric events into the counters: how many, and the last id folded, after
    which the next fold may start (None: from the first)."""

    folded: int
    last_id: int | None


def fold_metrics(conn: Connection, *, batch: int = 10_000, after: int | None = None) -> Folded:
    """Fold the metric events recorded after id ``after`` (None: from the first) into the
    counters, at most ``batch`` of them."""
    row = conn.execute(Q["fold_metrics"], {"batch": batch, "after": after}).one()
    return Folded(folded=row.folded, last_id=row.last_id)


@dataclass(frozen=True)
class HeadsAdvanced:
    """One run of advance_claim_heads(): how many heads moved (None when a transaction that made
    jobs claimable was open: nothing moved, the next run tries again), and the last organization
    visited, after which the next run goes on (None: start from the first)."""

    moved: int | None
    last_org: UUID | None


def advance_claim_heads(conn: Connection, *, lag: float, idle: float, after: UUID | None,
                        orgs: int) -> HeadsAdvanced:
    """Move the claim's heads of at most ``orgs`` organizations, round the ring from just after
    ``after``, forward to each key's first queued job, but no further than ``lag`` seconds ago,
    and drop keys with no queued job idle for ``idle`` seconds."""
    row = conn.execute(Q["advance_claim_heads"], {"lag_seconds": lag, "idle_seconds": idle,
                                                  "after": after, "orgs": orgs}).one()
    return HeadsAdvanced(moved=row.moved, last_org=row.last_org)


# ---------------------------------------------------------------------------------------------
# Waiting (75_waiting.sql): the lease holder's waits, steps and signals; the sweeper's resumes;
# a member's signal
# ---------------------------------------------------------------------------------------------

def wait_job(conn: Connection, job_id: UUID, token: UUID, *, until: datetime | None,
             signal: str | None, children: int | None) -> Status | None:
    """leased → waiting (or straight back to queued when what it waits for has come); None
    when the lease is no longer the caller's."""
    found: str | None = conn.execute(Q["wait_job"], {
        "id": job_id, "lease_token": token, "until": until, "signal": signal,
        "children": children}).scalar_one_or_none()
    return Status(found) if found else None


def resume_due_waits(conn: Connection, *, batch: int = 500) -> list[tuple[UUID, str]]:
    """Waiting jobs whose moment has come (and parents a child's end did not resume), queued."""
    return [(row.id, row.kind) for row in conn.execute(Q["resume_due_waits"], {"batch": batch})]


def resume_due_timers(conn: Connection, *, batch: int = 1000) -> list[tuple[UUID, str]]:
    """Waiting jobs whose moment has come, queued: the timers alone, one index range (beat's
    short cadence; the sweep's resume_due_waits covers them too, and the parents)."""
    return [(row.id, row.kind) for row in conn.execute(Q["resume_due_timers"], {"batch": batch})]


@dataclass(frozen=True)
class SignalOutcome:
    """What signal_job() answered: its outcome, a status (of the job that holds the signal once
    sent, else of the job addressed) and, once sent, which job holds it (the job addressed, or
    the step of a workflow that waits for it)."""

    outcome: str
    status: Status | None
    receiver: UUID | None


def signal_job(conn: Connection, job_id: UUID, name: str, payload: Any, user_id: UUID, *,
               kind_roles: Mapping[str, str]) -> SignalOutcome:
    """A member's signal (see signal_job() in the schema)."""
    row = conn.execute(Q["signal_job"], {
        "id": job_id, "name": name, "payload": json.dumps(payload), "user_id": user_id,
        "kind_roles": json.dumps(dict(kind_roles))}).one()
    return SignalOutcome(row.outcome, Status(row.status) if row.status else None, row.receiver)


def step_result(conn: Connection, job: LeasedJob, name: str) -> tuple[bool, Any]:
    """(True, what the step returned) if the held job recorded it, else (False, None);
    LeaseLost when the job's lease is no longer this attempt's."""
    row = conn.execute(Q["step_result"], {"job_id": job.id, "lease_token": job.lease_token,
                                          "name": name}).one()
    if not row.held:
        raise LeaseLost()
    return (True, row.result) if row.found else (False, None)


def record_step(conn: Connection, job: LeasedJob, name: str, result: Any) -> None:
    """Record what the held job's step returned (the first record of a name stays); LeaseLost,
    and nothing written, when the lease is no longer this attempt's."""
    held = conn.execute(Q["record_step"], {"job_id": job.id, "lease_token": job.lease_token,
                                           "name": name, "result": json.dumps(result)}).scalar_one()
    if not held:
        raise LeaseLost()


def take_signal(conn: Connection, job: LeasedJob, name: str, step: str) -> tuple[bool, Any]:
    """(True, what was recorded as the step ``step``: the payload with its sender) for the
    oldest signal ``name`` the held job has not taken yet, taking it; else (False, None).
    LeaseLost when the job's lease is no longer this attempt's."""
    row = conn.execute(Q["take_signal"], {"job_id": job.id, "lease_token": job.lease_token,
                                          "name": name, "step": step}).one()
    if not row.held:
        raise LeaseLost()
    return (True, row.recorded) if row.taken else (False, None)
