"""Operators: the dashboard (/ops), its JSON API (/ops/api), actions, and /metrics.

Everyone who is not an operator gets the same 404 as an unknown URL, tenant owners included.
Reads use the space_operator role, whose column grants leave out params, results and lease
tokens, so no page can show them even by mistake.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from flask import (
    Blueprint,
    Response,
    current_app,
    g,
    jsonify,
    redirect,
    render_template,
    request,
    url_for,
)
from flask.typing import ResponseReturnValue
from sqlalchemy import Engine

from spacejobs.models.db.transaction import transaction
from spacejobs.models.errors import InvalidRequest, NotFound
from spacejobs.models.jobs.holds import why_queued
from spacejobs.models.jobs.records import ALL_STATUSES, Status
from spacejobs.models.kinds import RateLimit, load_kinds
from spacejobs.models.ops import actions, dashboard
from spacejobs.models.ops.metrics import render as render_metrics
from spacejobs.models.tenancy.accounts import User
from spacejobs.webapp.auth import csrf_token, engine, identify, parse_id, remember, untouched_session
from spacejobs.webapp.inputs import bounded_float, whole_number
from spacejobs.webapp.jobs import job_api
from spacejobs.webapp.limits import api_limit
from spacejobs.webapp.ops_jobs import grouped_by_parent
from spacejobs.webapp.ops_kinds import SORTS, kind_table, per_minute_totals
from spacejobs.webapp.status import waiting_words

bp = Blueprint("ops", __name__)


def offline_after() -> float:
    return float(current_app.config["WORKER_OFFLINE_AFTER"])


def operator_db() -> Engine:
    db: Engine = current_app.extensions["spacejobs.operator_db"]
    return db


def is_ops_path(path: str) -> bool:
    return path.split("/")[1] in ("ops", "metrics")


@bp.before_app_request
def hide_from_everyone_else() -> None:
    """Every URL under /ops and /metrics, with ANY method, answers a non-operator the same 404
    as a URL that does not exist. This runs before routing's own answers (405 with an
    ``Allow`` header, the automatic OPTIONS), which would tell a stranger what is here."""
    if is_ops_path(request.path):
        require_operator()


def require_operator() -> User:
    """The operator, by bearer token or by web session (whose unsafe requests then need the
    CSRF token); anyone else: 404, as if nothing were here. The session is read apart from
    the request's own, so that the 404 carries nothing an unknown URL's does not (Flask adds
    ``Vary: Cookie`` to any answer whose session was read)."""
    if "user" in g:
        user: User = g.user
        if not user.is_operator:
            raise NotFound()
        return user
    found = identify(allow_session=True, cookie=untouched_session())
    if found is None or not found[0].is_operator:
        raise NotFound()
    return remember(*found)


def operator_only(view: Callable[..., ResponseReturnValue]) -> Callable[..., ResponseReturnValue]:
    """Belt and braces beside :func:`hide_from_everyone_else`: the view itself insists too."""

    @functools.wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> ResponseReturnValue:
        require_operator()
        return view(*args, **kwargs)

    return wrapped


def _done(payload: dict[str, Any], back: str) -> ResponseReturnValue:
    if g.auth_method == "session" and request.form:
        return redirect(back)
    return jsonify(payload)


def _filters() -> dict[str, Any]:
    status = request.args.get("status") or None
    if status is not None and status not in ALL_STATUSES:
        raise InvalidRequest("Unknown status filter.", fields=["status"])
    org = request.args.get("organization_id") or None
    hours = request.args.get("hours") or None
    since = None
    if hours:
        # At most ten years back: timedelta(hours=inf) or a date before year 1 would overflow.
        since = datetime.now(UTC) - timedelta(hours=bounded_float(hours, "hours", low=0, high=87600))
    try:
        organization_id = UUID(org) if org else None
        limit = min(max(int(request.args.get("limit", "100")), 1), 500)
    except ValueError:
        raise InvalidRequest("Invalid filter.", fields=["organization_id", "limit"]) from None
    return {"kind": request.args.get("kind") or None, "status": status,
            "organization_id": organization_id, "since": since,
            "running_only": request.args.get("running") == "1",
            "expired_only": request.args.get("expired") == "1", "limit": limit}


# ----------------------------------------------------------------------------- JSON API

@bp.get("/ops/api/overview")
@operator_only
@api_limit
def api_overview() -> ResponseReturnValue:
    with transaction(operator_db()) as conn:
        return jsonify(dashboard.dashboard(conn, offline_after=offline_after()))


@bp.get("/ops/api/jobs")
@operator_only
@api_limit
def api_jobs() -> ResponseReturnValue:
    with transaction(operator_db()) as conn:
        return jsonify({"jobs": dashboard.list_jobs(conn, **_filters())})


@bp.get("/ops/api/jobs/<job_id>")
@operator_only
@api_limit
def api_job(job_id: str) -> ResponseReturnValue:
    with transaction(operator_db()) as conn:
        return jsonify(dashboard.job_detail(conn, parse_id(job_id)))


@bp.get("/ops/api/workers")
@operator_only
@api_limit
def api_workers() -> ResponseReturnValue:
    with transaction(operator_db()) as conn:
        return jsonify({"workers": dashboard.workers(conn, offline_after=offline_after()),
                        "offline_after_seconds": offline_after()})


@bp.get("/ops/api/audit")
@operator_only
@api_limit
def api_audit() -> ResponseReturnValue:
    with transaction(operator_db()) as conn:
        return jsonify({"audit": dashboard.audit_log(conn)})


@bp.post("/ops/api/jobs/<job_id>/cancel")
@operator_only
@api_limit
def api_cancel(job_id: str) -> ResponseReturnValue:
    user = g.user
    job = job_api().cancel_as_operator(parse_id(job_id), operator_id=user.id,
                                       request_id=g.request_id)
    return _done({"id": str(job.id), "status": job.status}, url_for("ops.job_page", job_id=job_id))


@bp.post("/ops/api/jobs/<job_id>/retry")
@operator_only
@api_limit
def api_retry(job_id: str) -> ResponseReturnValue:
    user = g.user
    new = job_api().retry_as_new(parse_id(job_id), operator_id=user.id, request_id=g.request_id)
    return _done({"id": str(new.id), "status": new.status, "retry_of": job_id},
                 url_for("ops.job_page", job_id=str(new.id)))


@bp.post("/ops/api/kinds/<kind>/<action>")
@operator_only
@api_limit
def api_kind(kind: str, action: str) -> ResponseReturnValue:
    user = g.user
    if action in ("pause", "resume"):
        actions.set_kind_control(engine(), kind, operator_id=user.id, paused=action == "pause",
                             request_id=g.request_id)
    elif action == "limit":
        body = request.form if request.form else (request.get_json(silent=True) or {})
        raw = body.get("limit")
        # The column is an integer: anything past int4 (or not a whole number) is the caller's.
        limit = None if raw is None or raw == "" else whole_number(raw, "limit")
        actions.set_kind_control(engine(), kind, operator_id=user.id, concurrency_limit=limit,
                             request_id=g.request_id)
    else:
        raise NotFound()
    return _done({"kind": kind, "action": action}, url_for("ops.overview_page"))


@bp.post("/ops/api/rate-limits")
@operator_only
@api_limit
def api_rate_limit() -> ResponseReturnValue:
    """At most ``limit`` ("N per S seconds") of ``kind``'s jobs start in the organization
    ``organization_id``; "default" (or no limit) goes back to the kind's own."""
    body = request.form if request.form else (request.get_json(silent=True) or {})
    org, kind = str(body.get("organization_id") or ""), str(body.get("kind") or "")
    raw = str(body.get("limit") or "default").strip()
    try:
        limit = None if raw == "default" else RateLimit.parse(raw)
    except ValueError as exc:
        raise InvalidRequest(str(exc).capitalize() + ".", fields=["limit"]) from None
    try:
        organization_id = UUID(org)
    except ValueError:  # a field of the body, not an id of the URL: the same answer as unknown
        raise actions.no_such_organization() from None
    actions.set_rate_limit(engine(), organization_id, kind, limit, operator_id=g.user.id,
                           request_id=g.request_id)
    return _done({"organization_id": org, "kind": kind, "limit": str(limit) if limit else None},
                 url_for("ops.overview_page"))


# ----------------------------------------------------------------------------- metrics

@bp.get("/metrics")
@operator_only
@api_limit
def metrics() -> ResponseReturnValue:
    body = render_metrics(operator_db(), offline_after=offline_after())
    return Response(body, mimetype="text/plain; version=0.0.4")


# ----------------------------------------------------------------------------- HTML

def _page(template: str, **context: Any) -> str:
    return render_template(template, csrf=csrf_token(), operator=g.user, now=datetime.now(UTC),
                           offline_after=offline_after(), **context)


@bp.get("/ops")
@operator_only
def overview_page() -> ResponseReturnValue:
    with transaction(operator_db()) as conn:
        data = dashboard.dashboard(conn, offline_after=offline_after())
        orgs = dashboard.organizations(conn)
    data["settings"] = {s["kind"]: s for s in data["settings"]}
    registered = load_kinds()
    table = kind_table(registered, [name for name, k in registered.items() if k.rules.child_only],
                       data["kinds"], data["settings"], request.args.get("sort", "activity"))
    known = sorted(set(registered) | {k["kind"] for k in data["kinds"]})
    queued = sum(int(k.get("queued") or 0) for k in data["kinds"])
    return _page("ops/overview.html", known_kinds=known, table=table, sorts=SORTS,
                 organizations=orgs, queued_total=queued,
                 chart_points=per_minute_totals(table.active + table.child_only + table.idle),
                 **data)


@bp.get("/ops/jobs")
@operator_only
def jobs_page() -> ResponseReturnValue:
    filters = _filters()
    with transaction(operator_db()) as conn:
        rows = dashboard.list_jobs(conn, **filters)
        orgs = dashboard.organizations(conn)
        held = why_queued(conn, [row["id"] for row in rows if row["status"] == Status.QUEUED])
    return _page("ops/jobs.html", groups=grouped_by_parent(rows), jobs=rows, filters=request.args,
                 statuses=ALL_STATUSES, known_kinds=sorted(load_kinds()), organizations=orgs,
                 held={job_id: waiting_words(why) for job_id, why in held.items()})


@bp.get("/ops/jobs/<job_id>")
@operator_only
def job_page(job_id: str) -> ResponseReturnValue:
    with transaction(operator_db()) as conn:
        job = dashboard.job_detail(conn, parse_id(job_id))
        held = why_queued(conn, [job["id"]]) if job["status"] == Status.QUEUED else {}
    why = held.get(job["id"])
    return _page("ops/job.html", job=job, held=waiting_words(why) if why else None)


@bp.get("/ops/workers")
@operator_only
def workers_page() -> ResponseReturnValue:
    with transaction(operator_db()) as conn:
        rows = dashboard.workers(conn, offline_after=offline_after())
        audit = dashboard.audit_log(conn)
    return _page("ops/workers.html", workers=rows, audit=audit)
