"""What operators see. Reads run as space_operator, whose column grants leave out params,
results and lease tokens: no page could show them even by mistake."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from spacejobs.models.db.queries import queries_beside
from spacejobs.models.errors import NotFound

Q = queries_beside(__file__)


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


WAITS_FOR = ("timer", "signal", "children")


def waiting(conn: Connection) -> dict[str, Any]:
    """The waiting jobs: per kind and in all, how many wait for a timer, a signal or their
    children, how many timers are due, and since when the oldest waits."""
    kinds = _rows(conn, "waiting_by_kind")
    total: dict[str, Any] = {name: sum(k[name] for k in kinds)
                             for name in ("waiting", *WAITS_FOR, "due")}
    total["oldest_since"] = min((k["oldest_since"] for k in kinds), default=None)
    total["oldest_seconds"] = max((k["oldest_seconds"] for k in kinds), default=None)
    return {**total, "kinds": kinds}


#: how long the dashboard keeps showing a process that stopped, and one that went silent
STOPPED_SHOWN_SECONDS = 5 * 60
OFFLINE_SHOWN_SECONDS = 60 * 60


def slots(workers: list[dict[str, Any]]) -> dict[str, int]:
    """Job slots of the online processes: in all, busy and free (a process runs one job per
    slot; an offline one has none)."""
    total = sum(w["slots"] for w in workers)
    busy = min(total, sum(w["running"] for w in workers))
    return {"total": total, "busy": busy, "free": total - busy}


def organizations(conn: Connection) -> list[dict[str, Any]]:
    return _rows(conn, "organizations")


def dashboard(conn: Connection, *, offline_after: float) -> dict[str, Any]:
    """Everything the overview shows, for its HTML page and its JSON alike."""
    data = overview(conn)
    data["waiting"] = waiting(conn)
    data["running"] = list_jobs(conn, running_only=True, limit=100)
    data["expired"] = list_jobs(conn, expired_only=True, limit=100)
    data["failed"] = list_jobs(conn, status="failed", limit=20)
    data["workers"] = workers(conn, offline_after=offline_after)
    data["slots"] = slots(data["workers"])
    data["rate_limits"] = _rows(conn, "rate_limits")
    return data


def job_detail(conn: Connection, job_id: UUID) -> dict[str, Any]:
    found = _rows(conn, "job_detail", id=job_id)
    if not found:
        raise NotFound()
    detail = found[0]
    detail["events"] = _rows(conn, "job_events", id=job_id)
    detail["diagnostics"] = _rows(conn, "job_diagnostics", id=job_id)
    return detail


def job_organization(conn: Connection, job_id: UUID) -> UUID:
    """The organization of any job (an operator action then acts inside that organization)."""
    org: UUID | None = conn.execute(Q["job_organization"], {"id": job_id}).scalar_one_or_none()
    if org is None:
        raise NotFound()
    return org


def workers(conn: Connection, *, offline_after: float) -> list[dict[str, Any]]:
    """The worker processes, online first; an offline one counts nothing running (see
    dashboard.sql, ``workers``)."""
    return _rows(conn, "workers", offline_after=offline_after,
                 stopped_shown=STOPPED_SHOWN_SECONDS, offline_shown=OFFLINE_SHOWN_SECONDS)


def audit_log(conn: Connection, limit: int = 50) -> list[dict[str, Any]]:
    return _rows(conn, "audit", limit=limit)
