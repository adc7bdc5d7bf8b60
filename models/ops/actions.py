"""What operators do: cancel, retry as a new job, pause and resume a kind, limit its
concurrency. Each runs as space_app (scoped to the job's organization where a job is concerned)
and writes the operator audit log in the same transaction."""

from __future__ import annotations

import contextlib
import json
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, Engine

from models.db.queries import queries_beside
from models.db.transaction import transaction
from models.errors import InvalidRequest, NotFound
from models.jobs import store
from models.jobs.records import Job, Status
from models.kinds import get_any_kind
from models.ops.dashboard import job_organization

Q = queries_beside(__file__)

KEEP = object()  # set_kind_control: leave the concurrency limit as it is


def _audit(conn: Connection, operator_id: UUID, action: str, target: str,
           detail: dict[str, Any], request_id: str | None) -> None:
    conn.execute(Q["audit"], {"operator": operator_id, "action": action, "target": target,
                              "detail": json.dumps(detail), "request_id": request_id})


def _org_of(operator_db: Engine, job_id: UUID) -> UUID:
    with transaction(operator_db) as conn:
        return job_organization(conn, job_id)


def _as_operator(app_db: Engine, org: UUID, operator_id: UUID
                 ) -> contextlib.AbstractContextManager[Connection]:
    """A transaction in the job's organization, acting as the operator: the organization's
    audit log names them (the scoped user and the actor) for a cancel or a retry."""
    return transaction(app_db, organization_id=org, user_id=operator_id,
                       actor=f"operator:{operator_id}")


def cancel(app_db: Engine, operator_db: Engine, job_id: UUID, *, operator_id: UUID,
           request_id: str | None = None) -> Job:
    """Cancel any organization's job, as the operator (same rules as a user's cancel)."""
    org = _org_of(operator_db, job_id)
    with _as_operator(app_db, org, operator_id) as conn:
        job = store.request_cancel(conn, job_id, operator_id, request_id, as_operator=True)
        _audit(conn, operator_id, "cancel", str(job_id), {"status": job.status}, request_id)
    return job


def retry_as_new(app_db: Engine, operator_db: Engine, job_id: UUID, *, operator_id: UUID,
                 request_id: str | None = None) -> Job:
    """A failed or cancelled job again, as a NEW job (new id, same snapshot), linked to the old
    one. Terminal states never come back; the requester's membership is re-checked as usual."""
    org = _org_of(operator_db, job_id)
    with _as_operator(app_db, org, operator_id) as conn:
        old = conn.execute(Q["job_snapshot"], {"id": job_id}).mappings().one()
        if old["status"] not in (Status.FAILED, Status.CANCELLED):
            raise InvalidRequest("Only a failed or cancelled job can be retried.")
        rules = get_any_kind(old["kind"]).rules
        if rules.child_only:
            # Alone, it would run for nobody: only its parent collects its result.
            raise InvalidRequest("This job is a part of a fan-out: retry its parent instead.")
        try:
            new, _ = store.submit(conn, organization_id=org, requested_by=old["requested_by"],
                                  kind=rules, params=old["params"],
                                  request_id=request_id, retry_of=job_id)
        except NotFound:
            # The submit refuses a requester who left, as it refuses anyone outside the
            # organization; to an operator that is not a missing job.
            raise InvalidRequest("The job's requester is no longer a member of its organization;"
                                 " a new job would be refused.") from None
        _audit(conn, operator_id, "retry", str(job_id), {"new_job_id": str(new.id)}, request_id)
    return new


def set_kind_control(app_db: Engine, kind: str, *, operator_id: UUID, paused: bool | None = None,
                     concurrency_limit: int | object | None = KEEP,
                     request_id: str | None = None) -> None:
    """Pause/resume a kind or set its global concurrency limit (None removes the limit)."""
    get_any_kind(kind)  # operators pause and limit child-only kinds too
    if isinstance(concurrency_limit, int) and concurrency_limit < 0:
        raise InvalidRequest("A concurrency limit cannot be negative.")
    with transaction(app_db, actor=f"operator:{operator_id}") as conn:
        conn.execute(Q["ensure_kind_settings"], {"kind": kind, "operator": operator_id})
        detail: dict[str, Any] = {}
        if paused is not None:
            conn.execute(Q["set_paused"], {"paused": paused, "operator": operator_id, "kind": kind})
            detail["paused"] = paused
        if concurrency_limit is not KEEP:
            conn.execute(Q["set_concurrency_limit"],
                         {"limit": concurrency_limit, "operator": operator_id, "kind": kind})
            detail["concurrency_limit"] = concurrency_limit
        _audit(conn, operator_id, "kind_control", kind, detail, request_id)
