"""JSON API v1 (DESIGN.md §4). Views parse, resolve the organization, call one models function."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from flask import Blueprint, Response, current_app, g, jsonify, request, stream_with_context, url_for
from flask.typing import ResponseReturnValue
from pydantic import ValidationError

from spacejobs.demo import projects as tenant_projects
from spacejobs.demo.projects import Projects
from spacejobs.models.db.transaction import transaction
from spacejobs.models.errors import InvalidRequest, NotFound
from spacejobs.models.jobs import service, store
from spacejobs.models.jobs.holds import Waiting, waiting_in_row, why_waiting
from spacejobs.models.jobs.records import Job, Status
from spacejobs.models.json_limits import MAX_SIGNAL_BYTES
from spacejobs.models.tenancy import audit
from spacejobs.models.tenancy.access import find_membership
from spacejobs.models.tenancy.accounts import memberships_of
from spacejobs.webapp.auth import (
    current_user,
    engine,
    org_transaction,
    parse_id,
    still_authorized,
    user_transaction,
)
from spacejobs.webapp.bodies import IDEMPOTENCY_KEY, BodyT, CreateProject, SubmitBatch, SubmitJob
from spacejobs.webapp.jobs import job_api, list_page
from spacejobs.webapp.limits import api_limit, check_organization_submits, poll_limit, rate_key, submit_limit
from spacejobs.webapp.openapi import document as openapi_document_of
from spacejobs.webapp.paging import (
    decode_cursor,
    decode_place,
    encode_place,
    page_of,
    request_limit,
)
from spacejobs.webapp.results import stored_result_response
from spacejobs.webapp.status import waiting_words
from spacejobs.webapp.streams import StreamSlots

api = Blueprint("api", __name__, url_prefix="/api/v1")
log = logging.getLogger("spacejobs.web")

def parse_body(model: type[BodyT]) -> BodyT:
    """Strict bodies: unknown fields (``organization_id``, ``requested_by``...) are a 400."""
    raw = request.get_json(silent=True)
    if not isinstance(raw, dict):
        raise InvalidRequest("The body must be a JSON object.")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        fields = sorted({".".join(str(p) for p in e["loc"]) or "body" for e in exc.errors()})
        raise InvalidRequest("Invalid or unknown fields: " + ", ".join(fields) + ".",
                             fields=fields) from None


def job_json(job: Job, held: Mapping[UUID, Waiting] | None = None) -> dict[str, Any]:
    """A job as the API answers it. ``held``: why jobs wait (:func:`why_waiting`, read in the
    caller's transaction); without it a queued job's ``waiting_reason`` is null."""
    org, jid = str(job.organization_id), str(job.id)
    # The job's other URLs are its own with a suffix (the routes below): one URL built, not
    # four, which a page of jobs pays per job.
    here = url_for("api.get_job", org=org, job_id=jid)
    links = {"self": here, "result": here + "/result", "events": here + "/events",
             "cancel": here + "/cancel", "steps": here + "/steps"}
    if job.parent_id is not None:
        links["parent"] = here.removesuffix(jid) + str(job.parent_id)
    return {
        "id": jid,
        "kind": job.kind,
        "status": job.status,
        "organization_id": org,
        "requested_by": str(job.requested_by),
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "progress": job.progress,
        "error": job.error._asdict() if job.error else None,
        "created_at": _iso(job.created_at),
        "started_at": _iso(job.started_at),
        "finished_at": _iso(job.finished_at),
        "updated_at": _iso(job.updated_at),
        "cancel_requested_at": _iso(job.cancel_requested_at),
        "waiting_for": waiting_for(job),
        "waiting_reason": waiting_reason(job, held),
        "sequence_key": job.sequence_key,
        "parent_id": str(job.parent_id) if job.parent_id else None,
        "place": job.place,
        "links": links,
    }


def waiting_for(job: Job) -> dict[str, Any] | None:
    """What a waiting job waits for (Job.waiting_for: a moment, a signal's name, its children,
    how many were still active when it began to wait); None for a job that does not wait."""
    found = job.waiting_for
    if found is None:
        return None
    return {"until": _iso(found.until), "signal": found.signal, "children": found.children}


def waiting_reason(job: Job, held: Mapping[UUID, Waiting] | None) -> dict[str, Any] | None:
    """Why the job waits (models.jobs.holds): the reason, what it names, and the words the
    pages say; None for a job nothing holds back (running, ended, or queued and about to run)."""
    found = held.get(job.id) if held is not None else None
    if found is None and held is None and job.status == Status.WAITING:
        found = waiting_in_row(job)
    if found is None:
        return None
    return {"reason": str(found.reason), "until": _iso(found.until),
            "behind": str(found.behind) if found.behind else None, "signal": found.signal,
            "children": found.children, "words": waiting_words(found)}


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


@api.get("/openapi.json")
def openapi_document() -> ResponseReturnValue:
    """This API's OpenAPI 3.1 document, for everyone: it holds no secrets."""
    return jsonify(openapi_document_of(current_app))


@api.get("/me")
@api_limit
def me() -> ResponseReturnValue:
    # one transaction, opened by the statement that authenticates the token
    with user_transaction() as (conn, user):
        memberships = memberships_of(conn, user.id)
    return jsonify({
        "user": {"id": str(user.id), "email": user.email, "name": user.name},
        "memberships": memberships,
    })


# ----------------------------------------------------------------------------- projects

@api.get("/orgs/<org>/projects")
@api_limit
def list_projects(org: str) -> ResponseReturnValue:
    with org_transaction(org) as (conn, membership):
        projects = Projects(conn, membership.organization_id).list()
    return jsonify({"projects": [p.as_dict() for p in projects]})


@api.get("/orgs/<org>/projects/<project_id>")
@api_limit
def get_project(org: str, project_id: str) -> ResponseReturnValue:
    pid = parse_id(project_id)
    with org_transaction(org) as (conn, membership):
        project = Projects(conn, membership.organization_id).get(pid)
    if project is None:
        raise NotFound()
    return jsonify(project.as_dict())


@api.post("/orgs/<org>/projects")
@api_limit
def create_project(org: str) -> ResponseReturnValue:
    current_user()
    body = parse_body(CreateProject)
    with org_transaction(org) as (conn, membership):
        project = tenant_projects.create_project(conn, membership, body.name, body.description)
    return jsonify(project.as_dict()), 201


# ----------------------------------------------------------------------------- jobs

@api.post("/orgs/<org>/jobs")
@submit_limit
def submit_job(org: str) -> ResponseReturnValue:
    # ONE transaction, opened by the statement that authenticates (401) and finds the
    # membership (404): only then is the body validated, so strangers learn nothing of kinds.
    with org_transaction(org) as (conn, membership):
        check_organization_submits(membership.organization_id)
        body = parse_body(SubmitJob)
        idempotency_key = request.headers.get("Idempotency-Key")
        if idempotency_key is not None and not IDEMPOTENCY_KEY.fullmatch(idempotency_key):
            raise InvalidRequest("Idempotency-Key must be 1 to 200 printable ASCII characters.")
        submitted = job_api().submit_request(
            conn, body.as_request(), organization_id=membership.organization_id,
            requested_by=g.user.id, idempotency_key=idempotency_key, request_id=g.request_id)
        held = why_waiting(conn, [submitted.job])
    job = submitted.job
    answer = job_json(job, held)
    if submitted.debounced:
        answer["debounced"] = True
    response = jsonify(answer)
    response.status_code = 202
    response.headers["Location"] = answer["links"]["self"]
    if not submitted.created and not submitted.debounced:
        response.headers["Idempotent-Replayed"] = "true"
    return response


@api.post("/orgs/<org>/jobs:batch")
@submit_limit
def submit_jobs(org: str) -> ResponseReturnValue:
    """1 to 1,000 jobs in one request and one statement, all or nothing."""
    with org_transaction(org) as (conn, membership):
        check_organization_submits(membership.organization_id)
        body = parse_body(SubmitBatch)
        jobs = job_api().submit_many(
            conn, [j.as_request() for j in body.jobs], organization_id=membership.organization_id,
            requested_by=g.user.id, request_id=g.request_id)
        held = why_waiting(conn, jobs)
    return jsonify({"jobs": [job_json(job, held) for job in jobs]}), 202


@api.get("/orgs/<org>/jobs")
@api_limit
def list_jobs(org: str) -> ResponseReturnValue:
    limit = request_limit()
    with org_transaction(org) as (conn, membership):
        page, next_cursor = list_page(
            conn, membership, status=request.args.get("status") or None,
            kind=request.args.get("kind") or None, cursor=request.args.get("cursor"), limit=limit)
        held = why_waiting(conn, page)
    return jsonify({"jobs": [job_json(job, held) for job in page], "next_cursor": next_cursor})


@api.get("/orgs/<org>/jobs/<job_id>")
@poll_limit
def get_job(org: str, job_id: str) -> ResponseReturnValue:
    jid = parse_id(job_id)
    with org_transaction(org) as (conn, membership):
        job = job_api().get(conn, membership, jid)
        held = why_waiting(conn, [job])
    return jsonify(job_json(job, held))


@api.get("/orgs/<org>/jobs/<job_id>/result")
@api_limit
def get_job_result(org: str, job_id: str) -> ResponseReturnValue:
    jid = parse_id(job_id)
    # org_transaction checks CURRENT membership: a removed member gets 404 here.
    with org_transaction(org) as (conn, membership):
        job, result, stored = job_api().result(conn, membership, jid, g.request_id)
    if stored is not None:
        return stored_result_response(job, stored, envelope=True)
    return jsonify({"job_id": str(job.id), "kind": job.kind, "result": result})


@api.post("/orgs/<org>/jobs/<job_id>/cancel")
@api_limit
def cancel_job(org: str, job_id: str) -> ResponseReturnValue:
    jid = parse_id(job_id)
    # one statement authenticates the token and finds the membership (as a submit does)
    with org_transaction(org) as (conn, membership):
        job = job_api().cancel(conn, membership, jid, g.request_id)
        held = why_waiting(conn, [job])
    return jsonify(job_json(job, held)), 200 if job.status == "cancelled" else 202


@api.post("/orgs/<org>/jobs/<job_id>/resume")
@api_limit
def resume_job(org: str, job_id: str) -> ResponseReturnValue:
    """A failed or cancelled workflow, resumed as a new workflow from its last completed steps:
    202 with the new workflow."""
    jid = parse_id(job_id)
    with org_transaction(org) as (conn, membership):
        job = job_api().resume(conn, membership, jid, g.request_id)
    return jsonify(job_json(job)), 202


@api.post("/orgs/<org>/jobs/<job_id>/signals/<name>")
@api_limit
def signal_job(org: str, job_id: str, name: str) -> ResponseReturnValue:
    """The body, any JSON document of at most 64 KiB nesting arrays and objects at most 64 levels
    deep (none: null), is the signal's payload (models/json_limits.py)."""
    jid = parse_id(job_id)
    with org_transaction(org) as (conn, membership):
        raw = request.get_data(cache=True)
        if len(raw) > MAX_SIGNAL_BYTES:
            raise InvalidRequest(f"A signal's payload holds at most {MAX_SIGNAL_BYTES // 1024} KiB.",
                                 fields=["payload"])
        payload = request.get_json(silent=True) if raw.strip() else None
        if payload is None and raw.strip() and raw.strip() != b"null":
            raise InvalidRequest("The body must be a JSON document (the signal's payload).")
        delivered = job_api().signal(conn, membership, jid, name, payload)
    return jsonify({"job_id": str(jid), "signal": name, "status": delivered.status,
                    "received_by": str(delivered.job_id)}), 202


# ----------------------------------------------------------------------------- steps

@api.get("/orgs/<org>/jobs/<job_id>/steps")
@api_limit
def list_job_steps(org: str, job_id: str) -> ResponseReturnValue:
    """A parent's steps in place order (a workflow's by name, a fan-out's parts), those that are
    no job yet included; ``cursor`` pages on. Names, kinds and statuses: never params or
    results."""
    jid = parse_id(job_id)
    limit = request_limit()
    after = decode_place(request.args.get("cursor"))
    with org_transaction(org) as (conn, membership):
        jobs = job_api()
        job = jobs.get(conn, membership, jid)
        steps = jobs.steps(conn, membership, job, limit=limit + 1, after=after)
    shown = steps.rows[:limit]
    return jsonify({"job_id": str(job.id), "total": steps.total,
                    "steps": [step_json(job, step) for step in shown],
                    "next_cursor": next_place(shown, len(steps.rows) > limit)})


def next_place(shown: Sequence[store.Step] | Sequence[store.StepResult], more: bool) -> str | None:
    """The cursor of the page after ``shown`` (fetched with one row more), when there is one."""
    return encode_place(shown[-1].place) if more else None


def step_json(parent: Job, step: store.Step) -> dict[str, Any]:
    """One of a parent's steps: a step that is no job yet is ``pending`` while its parent may
    still make it and ``skipped`` once the parent has ended."""
    if step.status is not None:
        status: str = step.status
    else:
        status = "skipped" if parent.finished else "pending"
    made = step.job_id is not None
    return {
        "place": step.place,
        "name": step.name,
        "kind": step.kind,
        "status": status,
        "job_id": str(step.job_id) if made else None,
        "attempts": step.attempts if made else None,
        "error_code": step.error_code,
        "links": {"job": url_for("api.get_job", org=str(parent.organization_id),
                                 job_id=str(step.job_id))} if made else None,
    }


@api.get("/orgs/<org>/jobs/<job_id>/steps/results")
@api_limit
def list_job_step_results(org: str, job_id: str) -> ResponseReturnValue:
    """The results of a parent's steps that completed so far, whatever its own status (a
    failed workflow's partial results), by the rule of the parent's own result."""
    jid = parse_id(job_id)
    limit = min(request_limit(service.MAX_RESULTS_LISTED), service.MAX_RESULTS_LISTED)
    after = decode_place(request.args.get("cursor"))
    with org_transaction(org) as (conn, membership):
        job, results = job_api().step_results(conn, membership, jid, limit=limit + 1,
                                              after=after, request_id=g.request_id)
    shown = results[:limit]
    return jsonify({"job_id": str(job.id), "status": job.status,
                    "results": [step_result_json(job, done) for done in shown],
                    "next_cursor": next_place(shown, len(results) > limit)})


def step_result_json(parent: Job, done: store.StepResult) -> dict[str, Any]:
    here = url_for("api.get_job", org=str(parent.organization_id), job_id=str(done.job_id))
    return {"place": done.place, "name": done.name, "kind": done.kind,
            "job_id": str(done.job_id), "result": done.result, "result_expired": done.expired,
            "links": {"job": here, "result": here + "/result"}}


# ----------------------------------------------------------------------------- audit log

@api.get("/orgs/<org>/audit")
@api_limit
def org_audit(org: str) -> ResponseReturnValue:
    """The organization's audit log, newest first, to its owners and admins (403 for a plain
    member; 404 for anyone else, as everywhere). Filter ``action``; ``cursor`` pages on."""
    limit = request_limit()
    with org_transaction(org) as (conn, membership):
        rows = audit.entries(conn, membership, action=request.args.get("action") or None,
                             before=decode_cursor(request.args.get("cursor"), _entry_id),
                             limit=limit + 1)
    entries, next_cursor = page_of(rows, limit, lambda entry: (entry.at, entry.id))
    return jsonify({"entries": [audit_json(entry) for entry in entries],
                    "next_cursor": next_cursor})


def _entry_id(value: str) -> int:
    """An entry id from a cursor: a bigint, or the cursor is not valid (never a database error)."""
    number = int(value)
    if not 0 < number < 2**63:
        raise ValueError("not an entry id")
    return number


def audit_json(entry: audit.AuditEntry) -> dict[str, Any]:
    def text(value: object) -> str | None:
        return str(value) if value is not None else None

    return {
        "id": entry.id,
        "action": entry.action,
        "actor": {"user_id": text(entry.actor_id), "as": entry.actor},
        "job_id": text(entry.job_id),
        "member_id": text(entry.member_id),
        "detail": entry.detail,
        "request_id": entry.request_id,
        "at": _iso(entry.at),
    }


# ----------------------------------------------------------------------------- job events

@api.get("/orgs/<org>/jobs/<job_id>/events")
@api_limit
def job_event_stream(org: str, job_id: str) -> ResponseReturnValue:
    """Server-sent events: the job as JSON whenever its status or progress changes; the stream
    ends at a terminal state (or after SPACEJOBS_EVENTS_MAX_SECONDS; reconnect to go on).

    The one JSON endpoint a web session may open besides a bearer token: a browser's
    ``EventSource`` cannot send an ``Authorization`` header, and it only reads.

    Each event's ``id`` names the job's visible state (``<attempt>.<status>.<digest>``, the
    digest of its progress and of what it waits for): the stream carries states, not a log,
    so a client that reconnects with ``Last-Event-ID`` gets nothing until the job differs
    from the state it already has, and a finished job it has already seen answers 204, which
    tells an ``EventSource`` to stop reconnecting.

    Each poll is its own short transaction that re-checks the credential and the membership,
    so a revoked session or token, or a member removed while watching, stops receiving at
    once, and no connection is held between polls.
    """
    jid = parse_id(job_id)
    user = current_user(allow_session=True)
    with org_transaction(org) as (conn, membership):
        job = job_api().get(conn, membership, jid)
    seen = request.headers.get("Last-Event-ID", "")
    if job.finished and event_id(job) == seen:
        return Response(status=204)
    org_id, authorized = membership.organization_id, still_authorized()
    interval = float(current_app.config["EVENTS_POLL_SECONDS"])
    max_seconds = float(current_app.config["EVENTS_MAX_SECONDS"])
    db, jobs = engine(), job_api()

    def stream() -> Iterator[str]:
        started = last_write = time.monotonic()
        last = seen
        yield "retry: 1000\n\n"
        while True:
            with transaction(db, organization_id=org_id, user_id=user.id) as conn:
                member = find_membership(conn, org_id, user.id) if authorized(conn) else None
                try:
                    job = jobs.get(conn, member, jid) if member is not None else None
                except NotFound:
                    job = None
                # a queued job's: index probes of this one job (models/jobs/holds.py)
                held = why_waiting(conn, [job]) if job is not None else {}
            if job is None:
                yield _sse("error", {"error": {"code": "not_found", "message": "Not found."}})
                return
            current = event_id(job, held)
            if current != last:
                # "status" when the status or the attempt changed, "progress" otherwise
                name = "progress" if current.rsplit(".", 1)[0] == last.rsplit(".", 1)[0] else "status"
                yield _sse(name, job_json(job, held), current)
                last, last_write = current, time.monotonic()
            if job.finished or time.monotonic() - started > max_seconds:
                return
            if time.monotonic() - last_write > 15:
                yield ": keep-alive\n\n"  # proxies close silent connections
                last_write = time.monotonic()
            time.sleep(interval)

    slots: StreamSlots = current_app.extensions["spacejobs.streams"]
    release = slots.take(org_id, rate_key())
    response = Response(stream_with_context(stream()), mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    # When the stream ends, or the client goes away (the server then closes the response),
    # even before its first byte.
    response.call_on_close(release)
    return response


def event_id(job: Job, held: Mapping[UUID, Waiting] | None = None) -> str:
    # What it waits for is part of the visible state: a job that waits again for something
    # else between two polls (a second signal) keeps its attempt, status and progress, and a
    # queued job held back by a rate limit, then by a sequence, keeps its status.
    wait = waiting_reason(job, held)
    seen = job.progress if wait is None else [job.progress, wait]
    digest = hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()[:12]
    return f"{job.attempts}.{job.status}.{digest}"


def _sse(event: str, data: dict[str, Any], event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {json.dumps(data)}\n\n"
