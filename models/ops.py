"""What operators see and do. Reads run as space_operator (no params, results or tokens by
construction); actions run as space_app scoped to the job's organization, and every action
writes the operator audit log in the same transaction."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, Engine, text

from models import jobs
from models.db import load_queries, transaction
from models.errors import InvalidRequest, NotFound
from models.kinds import get_kind

Q = {name: text(sql) for name, sql in load_queries("ops.sql").items()}


def _rows(conn: Connection, name: str, **params: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(Q[name], params).mappings()]


def overview(conn: Connection) -> dict[str, Any]:
    kinds = _rows(conn, "kinds_overview")
    series: dict[str, list[dict[str, Any]]] = {}
    for row in _rows(conn, "finished_per_minute"):
        series.setdefault(row["kind"], []).append(
            {"minute": row["minute"], "completed": row["completed"], "failed": row["failed"]})
    settings = {s["kind"]: s for s in _rows(conn, "kind_settings")}
    for kind in kinds:
        kind["per_minute"] = series.get(kind["kind"], [])
        control = settings.get(kind["kind"], {})
        kind["paused"] = bool(control.get("paused"))
        kind["concurrency_limit"] = control.get("concurrency_limit")
    return {"kinds": kinds, "settings": list(settings.values())}


def list_jobs(
    conn: Connection,
    *,
    kind: str | None = None,
    status: str | None = None,
    organization_id: UUID | None = None,
    since: datetime | None = None,
    running_only: bool = False,
    expired_only: bool = False,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Newest first. ``running_only``: leased or cancel_requested (a job asked to stop still runs)."""
    return _rows(conn, "list_jobs", kind=kind, status=status, organization_id=organization_id,
                 since=since, running_only=running_only, expired_only=expired_only, limit=limit)


def dashboard(conn: Connection, *, offline_after: float) -> dict[str, Any]:
    """Everything the overview shows, for its HTML page and its JSON alike."""
    data = overview(conn)
    data["running"] = list_jobs(conn, running_only=True, limit=100)
    data["expired"] = list_jobs(conn, expired_only=True, limit=100)
    data["failed"] = list_jobs(conn, status="failed", limit=20)
    data["workers"] = workers(conn, offline_after=offline_after)
    return data


def job_detail(conn: Connection, job_id: UUID) -> dict[str, Any]:
    found = _rows(conn, "job_detail", id=job_id)
    if not found:
        raise NotFound()
    detail = found[0]
    detail["events"] = _rows(conn, "job_events", id=job_id)
    detail["diagnostics"] = _rows(conn, "job_diagnostics", id=job_id)
    return detail


def workers(conn: Connection, *, offline_after: float) -> list[dict[str, Any]]:
    return _rows(conn, "workers", offline_after=offline_after)


def audit_log(conn: Connection, limit: int = 50) -> list[dict[str, Any]]:
    return _rows(conn, "audit", limit=limit)


# ------------------------------------------------------------------------- actions (space_app)

def _audit(conn: Connection, operator_id: UUID, action: str, target: str,
           detail: dict[str, Any], request_id: str | None) -> None:
    conn.execute(
        text("INSERT INTO operator_audit (operator_id, action, target, detail, request_id)"
             " VALUES (:op, :action, :target, :detail, :rid)"),
        {"op": operator_id, "action": action, "target": target, "detail": json.dumps(detail),
         "rid": request_id},
    )


def _job_org(operator_db: Engine, job_id: UUID) -> UUID:
    with transaction(operator_db) as conn:
        org = conn.execute(text("SELECT organization_id FROM jobs WHERE id = :id"),
                           {"id": job_id}).scalar_one_or_none()
    if org is None:
        raise NotFound()
    return org


def cancel(app_db: Engine, operator_db: Engine, job_id: UUID, *, operator_id: UUID,
           request_id: str | None = None) -> jobs.Job:
    """Cancel any organization's job, as the operator (same rules as a user's cancel)."""
    org = _job_org(operator_db, job_id)
    with transaction(app_db, organization_id=org, actor=f"operator:{operator_id}") as conn:
        job = jobs.request_cancel(conn, job_id, operator_id)
        _audit(conn, operator_id, "cancel", str(job_id), {"status": job.status}, request_id)
    return job


def retry_as_new(app_db: Engine, operator_db: Engine, job_id: UUID, *, operator_id: UUID,
                 request_id: str | None = None) -> jobs.Job:
    """A failed or cancelled job again, as a NEW job (new id, same snapshot), linked to the old
    one. Terminal states never come back; the requester's membership is re-checked as usual."""
    org = _job_org(operator_db, job_id)
    with transaction(app_db, organization_id=org, actor=f"operator:{operator_id}") as conn:
        old = conn.execute(text("SELECT * FROM jobs WHERE id = :id"), {"id": job_id}).mappings().one()
        if old["status"] not in ("failed", "cancelled"):
            raise InvalidRequest("Only a failed or cancelled job can be retried.")
        new, _ = jobs.submit(conn, organization_id=org, requested_by=old["requested_by"],
                             kind=get_kind(old["kind"]), params=old["params"],
                             request_id=request_id)
        conn.execute(text("UPDATE jobs SET retry_of = :old WHERE id = :new"),
                     {"old": job_id, "new": new.id})
        _audit(conn, operator_id, "retry", str(job_id), {"new_job_id": str(new.id)}, request_id)
    return new


def set_kind_control(app_db: Engine, kind: str, *, operator_id: UUID, paused: bool | None = None,
                     concurrency_limit: int | str | None = "keep",
                     request_id: str | None = None) -> None:
    """Pause/resume a kind or set its global concurrency limit (None removes the limit)."""
    get_kind(kind)
    if isinstance(concurrency_limit, int) and concurrency_limit < 0:
        raise InvalidRequest("A concurrency limit cannot be negative.")
    with transaction(app_db, actor=f"operator:{operator_id}") as conn:
        conn.execute(
            text("INSERT INTO kind_settings (kind, updated_by) VALUES (:kind, :op)"
                 " ON CONFLICT (kind) DO NOTHING"), {"kind": kind, "op": operator_id})
        detail: dict[str, Any] = {}
        if paused is not None:
            conn.execute(text("UPDATE kind_settings SET paused = :p, updated_at = now(),"
                              " updated_by = :op WHERE kind = :kind"),
                         {"p": paused, "op": operator_id, "kind": kind})
            detail["paused"] = paused
        if concurrency_limit != "keep":
            conn.execute(text("UPDATE kind_settings SET concurrency_limit = :n, updated_at = now(),"
                              " updated_by = :op WHERE kind = :kind"),
                         {"n": concurrency_limit, "op": operator_id, "kind": kind})
            detail["concurrency_limit"] = concurrency_limit
        _audit(conn, operator_id, "kind_control", kind, detail, request_id)
