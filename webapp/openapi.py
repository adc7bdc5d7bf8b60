"""The OpenAPI 3.1 document of the JSON API (``GET /api/v1/openapi.json``), generated, not written.

- Request bodies are the pydantic models the views validate with (webapp.api), response bodies
  the models below, all through pydantic's JSON Schema (OpenAPI 3.1 is JSON Schema 2020-12).
- Each error response lists the codes an operation may answer, grouped by the HTTP status the
  error table gives them (webapp.errors.HTTP_STATUS): the table and the document cannot differ.
- Paths come from the app's URL map, so an operation is documented where it is routed;
  :data:`OPERATIONS` says only what each one takes and answers, and building the document
  fails for a JSON API route it does not describe.

schemathesis checks the running app against it in CI (tests/contract/).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypedDict
from uuid import UUID

from flask import Flask
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from spacejobs.models.jobs.canvas import WORKFLOW_KIND, WorkflowParams
from spacejobs.models.jobs.records import ALL_STATUSES
from spacejobs.models.json_limits import MAX_BODY_BYTES, MAX_DEPTH, MAX_PARAMS_BYTES, MAX_SIGNAL_BYTES
from spacejobs.models.kinds import SIGNAL_NAME, submittable_kinds
from spacejobs.models.tenancy import audit
from spacejobs.webapp.bodies import CreateProject, SubmitBatch, SubmitJob
from spacejobs.webapp.errors import HTTP_STATUS

if TYPE_CHECKING:
    JobStatus = str  # to the checker; the schema's enum is made from the statuses at run time
else:
    JobStatus = Literal[tuple(ALL_STATUSES)]


# ----------------------------------------------------------------------------- response bodies

class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobLinks(Answer):
    self: str
    result: str
    events: str
    cancel: str
    #: its steps (a workflow's) or parts (a fan-out's); an empty list for a job without any
    steps: str
    #: the job it is a step or part of (only for such a job)
    parent: str | None = None


class JobFailure(Answer):
    code: str
    message: str


class WaitingFor(Answer):
    """What a waiting job waits for (it holds no worker meanwhile)."""

    until: datetime | None
    signal: str | None
    children: int | None = None  # its children still active when it began to wait


class WaitingReason(Answer):
    """Why a job that has not ended is not running now, for a queued job held back as for a
    waiting one (models.jobs.holds.why_waiting: one statement of index probes per page)."""

    #: sequence: an earlier job of its sequence has not ended (``behind``); delayed: its start
    #: was put off (a delay, a retry's backoff) ``until``; rate_limit: its kind's rate limit
    #: window in its organization is full ``until`` it lets one more start; signal, children,
    #: moment: what a waiting job waits for (``until``: a signal's deadline, or the moment)
    reason: Literal["sequence", "delayed", "rate_limit", "signal", "children", "moment"]
    until: datetime | None
    #: the job it waits behind (a sequence's)
    behind: UUID | None
    signal: str | None
    children: int | None
    #: the same, in the words the job's page says
    words: str


class SignalSent(Answer):
    #: the job the signal was sent to
    job_id: UUID
    signal: str
    #: the status, after the signal, of the job that holds it (queued: it was waiting for it)
    status: JobStatus
    #: the job that holds the signal: the job itself, or the step of a workflow that waits for it
    received_by: UUID


class Job(Answer):
    """A job as its organization sees it (never its params, result or lease)."""

    id: UUID
    kind: str
    status: JobStatus
    organization_id: UUID
    requested_by: UUID
    attempts: int
    max_attempts: int
    progress: dict[str, Any] | None
    error: JobFailure | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    cancel_requested_at: datetime | None
    waiting_for: WaitingFor | None
    #: why it is not running now; null for a job nothing holds back (running, ended, or queued
    #: and about to start)
    waiting_reason: WaitingReason | None
    #: the sequence it runs in (one at a time, in submit order), if any
    sequence_key: str | None
    #: only in a submit's answer, when a queued job of the dedup_key took the params
    debounced: bool = False
    #: the job it is a step (a workflow's) or a part (a fan-out's) of, and its place there
    #: (from 0, as in the parent's steps); null for a job its requester started
    parent_id: UUID | None
    place: int | None
    links: JobLinks


class JobPage(Answer):
    jobs: list[Job]
    next_cursor: str | None


class JobBatch(Answer):
    jobs: list[Job]


class JobResult(Answer):
    job_id: UUID
    kind: str
    result: Any


#: a step that is no job yet: pending while its parent may still make it, skipped once the
#: parent has ended without it
StepStatus = JobStatus | Literal["pending", "skipped"]


class StepLinks(Answer):
    job: str


class Step(Answer):
    """One of a parent's steps (a workflow's, by name) or parts (a fan-out's): never its params,
    result or message."""

    #: from 0, the step's index in the workflow's ``steps``
    place: int
    #: a workflow step's name; null for a fan-out's part
    name: str | None
    kind: str
    status: StepStatus
    #: null for a step that is no job yet
    job_id: UUID | None
    attempts: int | None
    error_code: str | None
    links: StepLinks | None


class StepPage(Answer):
    job_id: UUID
    #: how many steps the parent has in all (made or not)
    total: int
    steps: list[Step]
    next_cursor: str | None


class StepResultLinks(Answer):
    job: str
    result: str


class StepResult(Answer):
    """A completed step's result, as the step's own result read answers it (a file stored in the
    results store is its descriptor here: its ``result`` link downloads it)."""

    place: int
    name: str | None
    kind: str
    job_id: UUID
    result: Any
    #: true once retention dropped the result (``result`` is then null)
    result_expired: bool
    links: StepResultLinks


class StepResultPage(Answer):
    job_id: UUID
    #: the parent's own status: a failed or cancelled workflow's completed steps are here too
    status: JobStatus
    results: list[StepResult]
    next_cursor: str | None


class Project(Answer):
    id: UUID
    organization_id: UUID
    name: str
    description: str
    created_at: datetime


class ProjectList(Answer):
    projects: list[Project]


class MeUser(Answer):
    id: UUID
    email: str
    name: str


class MeMembership(Answer):
    organization_id: UUID
    organization_name: str
    organization_state: str
    role: str


class Me(Answer):
    user: MeUser
    memberships: list[MeMembership]


class FieldReason(Answer):
    """Why one field was refused (``invalid_params``): a bound or a shape, never the value sent."""

    field: str
    reason: str


class ErrorBody(Answer):
    code: str
    message: str
    job_id: UUID | None = None
    fields: list[str] | None = None
    reasons: list[FieldReason] | None = None
    status: str | None = None
    index: int | None = None
    #: the refused step of a workflow: its index in ``params.steps``, from 0, or
    #: ``"on_failure"`` for its failure handler
    step: int | Literal["on_failure"] | None = None
    limit: int | None = None


class Error(Answer):
    error: ErrorBody


class AuditActor(Answer):
    user_id: UUID | None
    # "as": how the user acted, in job_events.actor's words (user:<id>, operator:<id>, cli)
    acted_as: str = Field(alias="as")


class AuditEntry(Answer):
    """One entry of an organization's audit log (never a job's params or result)."""

    id: int
    action: str
    actor: AuditActor
    job_id: UUID | None
    member_id: UUID | None
    detail: dict[str, Any]
    request_id: str | None
    at: datetime


class AuditPage(Answer):
    entries: list[AuditEntry]
    next_cursor: str | None


# ----------------------------------------------------------------------------- operations

#: what every JSON API request may answer, whatever it asks
ANY_REQUEST = ("invalid_request", "rate_limited", "internal_error", "unavailable")
#: ... and every request that names an organization
IN_ORGANIZATION = ("unauthorized", "not_found", "organization_unavailable")
BODY = ("payload_too_large",)


class Link(TypedDict):
    """An OpenAPI link: the operation an answer leads to, and its parameters' sources."""

    operationId: str
    parameters: dict[str, str]


#: What an answer holds: a model, "object" (any JSON object), "stream" (server-sent events),
#: "result" (a job's result: JSON or a file), or None (no body).
AnswerBody = type[BaseModel] | Literal["object", "stream", "result"] | None


@dataclass(frozen=True)
class Operation:
    """One JSON API operation: its Flask endpoint and what it takes and answers."""

    endpoint: str
    method: str
    summary: str
    answers: dict[int, tuple[str, AnswerBody]]  # status: (description, body)
    errors: tuple[str, ...] = ()
    body: type[BaseModel] | None = None
    query: dict[str, dict[str, Any]] = field(default_factory=dict)
    headers: dict[str, dict[str, Any]] = field(default_factory=dict)
    links: dict[int, dict[str, Link]] = field(default_factory=dict)
    public: bool = False
    raw_body: bool = False  # any JSON document (a signal's payload)


def _job_links(job_id: str) -> dict[str, Link]:
    params = {"org": "$request.path.org", "job_id": job_id}
    return {name: {"operationId": target, "parameters": params} for name, target in (
        ("GetJob", "get_job"), ("GetJobResult", "get_job_result"), ("CancelJob", "cancel_job"),
        ("JobEvents", "job_event_stream"), ("JobSteps", "list_job_steps"),
        ("JobStepResults", "list_job_step_results"))}


#: the query of a list in place order (a parent's steps)
PLACE_PAGE: dict[str, dict[str, Any]] = {
    "limit": {"type": "integer", "description": "1 to 200 (clamped)"},
    "cursor": {"type": "string", "description": "next_cursor of the page before"},
}

SUBMIT_ERRORS = ("invalid_params", "unknown_kind", "insufficient_role", "organization_read_only",
                 "duplicate_job", "too_many_jobs", *BODY)

OPERATIONS = (
    Operation("api.openapi_document", "get", "This document", {200: ("OpenAPI 3.1", "object")},
              public=True),
    Operation("api.me", "get", "The user and their memberships", {200: ("the user", Me)},
              ("unauthorized",)),
    Operation("api.list_projects", "get", "The organization's projects",
              {200: ("projects", ProjectList)}, IN_ORGANIZATION),
    Operation("api.get_project", "get", "One project", {200: ("the project", Project)},
              IN_ORGANIZATION),
    Operation("api.create_project", "post", "Create a project", {201: ("created", Project)},
              (*IN_ORGANIZATION, "organization_read_only", "insufficient_role", *BODY),
              body=CreateProject,
              links={201: {"GetProject": {"operationId": "get_project", "parameters": {
                  "org": "$request.path.org", "project_id": "$response.body#/id"}}}}),
    Operation("api.submit_job", "post", "Submit a job", {202: ("accepted (or an idempotent replay)", Job)},
              (*IN_ORGANIZATION, *SUBMIT_ERRORS, "idempotency_key_reused"), body=SubmitJob,
              headers={"Idempotency-Key": {"type": "string", "pattern": "^[\\x20-\\x7e]{1,200}$"}},
              links={202: _job_links("$response.body#/id")}),
    Operation("api.submit_jobs", "post", "Submit 1 to 1,000 jobs, all or nothing",
              {202: ("accepted", JobBatch)}, (*IN_ORGANIZATION, *SUBMIT_ERRORS), body=SubmitBatch,
              links={202: _job_links("$response.body#/jobs/0/id")}),
    Operation("api.list_jobs", "get", "The organization's jobs, newest first",
              {200: ("a page of jobs", JobPage)}, IN_ORGANIZATION,
              query={"status": {"type": "string", "enum": list(ALL_STATUSES)},
                     "kind": {"type": "string"},
                     "limit": {"type": "integer", "description": "1 to 200 (clamped)"},
                     "cursor": {"type": "string", "description": "next_cursor of the page before"}}),
    Operation("api.get_job", "get", "One job", {200: ("the job", Job)}, IN_ORGANIZATION),
    Operation("api.get_job_result", "get", "A completed job's result",
              {200: ("the result as JSON, or the file the kind stored (its own Content-Type, as"
                     " an attachment)", "result")},
              (*IN_ORGANIZATION, "insufficient_role", "job_not_completed", "result_expired",
               "result_missing")),
    Operation("api.cancel_job", "post", "Cancel a job",
              {200: ("cancelled (it was queued)", Job),
               202: ("cancel requested (it is running)", Job)},
              (*IN_ORGANIZATION, "insufficient_role", "job_finished")),
    Operation("api.resume_job", "post",
              "Resume a failed or cancelled workflow from its last completed steps",
              {202: ("the new workflow (queued; its completed steps are reused, never run "
                     "again)", Job)},
              (*IN_ORGANIZATION, "insufficient_role", "job_not_resumable", "already_resumed",
               "requester_not_member", "too_many_jobs", "organization_read_only"),
              links={202: _job_links("$response.body#/id")}),
    Operation("api.signal_job", "post", "Send a job a signal (its payload is the body)",
              {202: ("sent: a wait of the job for this name takes it, now or later, once; sent "
                     "to a workflow, the step that waits for it now takes it (`received_by`). "
                     "A signal the job's kind declares must fit the model it declares for it "
                     "(`invalid_params` otherwise, as for a job's params)",
                     SignalSent)},
              (*IN_ORGANIZATION, "insufficient_role", "job_finished", "too_many_signals",
               "no_step_waits", "invalid_params", *BODY),
              raw_body=True),
    Operation("api.list_job_steps", "get",
              "A job's steps (a workflow's) or parts (a fan-out's), in place order",
              {200: ("a page of steps, those that are no job yet included", StepPage)},
              IN_ORGANIZATION, query=PLACE_PAGE),
    Operation("api.list_job_step_results", "get",
              "The results of a job's completed steps so far (a failed workflow's partial "
              "results), by the rule of the job's own result",
              {200: ("a page of results", StepResultPage)}, (*IN_ORGANIZATION, "insufficient_role"),
              query={"limit": {"type": "integer", "description": "1 to 50 (clamped)"},
                     "cursor": PLACE_PAGE["cursor"]}),
    Operation("api.job_event_stream", "get", "Server-sent events of the job's status and progress",
              {200: ("text/event-stream: `status` and `progress` events, data = the job", "stream"),
               204: ("the finished job named by Last-Event-ID: nothing more to send", None)},
              (*IN_ORGANIZATION, "too_many_streams"),
              headers={"Last-Event-ID": {"type": "string"}}),
    Operation("api.org_audit", "get", "The organization's audit log, newest first (owners, admins)",
              {200: ("a page of entries", AuditPage)}, (*IN_ORGANIZATION, "insufficient_role"),
              query={"action": {"type": "string", "enum": list(audit.ACTIONS)},
                     "limit": {"type": "integer", "description": "1 to 200 (clamped)"},
                     "cursor": {"type": "string", "description": "next_cursor of the page before"}}),
)

#: path parameters that are not ids
PATH_SCHEMAS: dict[str, dict[str, Any]] = {
    "name": {"type": "string", "pattern": f"^{SIGNAL_NAME.pattern}$"},
}

#: one event of the stream: `status` or `progress` with the job as data, or `error` (access lost)
SERVER_SENT_EVENT = {
    "type": "object",
    "properties": {
        "event": {"enum": ["status", "progress", "error"]},
        "id": {"type": "string", "description": "<attempt>.<status>.<progress digest>"},
        "data": {"type": "string", "contentMediaType": "application/json",
                 "contentSchema": {"anyOf": [{"$ref": "#/components/schemas/Job"},
                                             {"$ref": "#/components/schemas/Error"}]}},
        "retry": {"type": "integer"},
    },
}

RETRY_AFTER = {"Retry-After": {"required": True, "description": "seconds to wait",
                               "schema": {"type": "integer", "minimum": 0}}}


def document(app: Flask) -> dict[str, Any]:
    """The document of this app's JSON API (built once per app)."""
    cached = app.extensions.get("spacejobs.openapi")
    if cached is None:
        cached = app.extensions["spacejobs.openapi"] = _build(app)
    return cached


def _build(app: Flask) -> dict[str, Any]:
    inputs: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        (m, "validation") for m in (SubmitJob, SubmitBatch, CreateProject)]
    inputs.append((WorkflowParams, "validation"))
    outputs: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        (m, "serialization") for m in (Job, JobPage, JobBatch, JobResult, Project, ProjectList, Me,
                                       Error, AuditPage, SignalSent, StepPage, StepResultPage)]
    _, schemas = models_json_schema(inputs + outputs, ref_template="#/components/schemas/{model}")
    _describe_submits(schemas["$defs"])
    rules = {rule.endpoint: rule for rule in app.url_map.iter_rules()
             if rule.endpoint.startswith("api.")}
    described = {op.endpoint for op in OPERATIONS}
    if set(rules) - described:
        raise RuntimeError(f"JSON API routes without an OpenAPI operation: {set(rules) - described}")
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        rule = rules[op.endpoint]
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        paths.setdefault(path, {})[op.method] = _operation(op, rule.arguments)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Space Jobs API", "version": "1",
                 "description": "Durable, tenant-scoped background jobs. Errors are "
                                "`{\"error\": {\"code\", \"message\", ...}}`; the codes of each "
                                "answer are listed with it. A body holds at most "
                                f"{MAX_BODY_BYTES // 2**20} MiB (413 `payload_too_large`); a job's "
                                f"params at most {MAX_PARAMS_BYTES // 2**20} MiB and a signal's "
                                f"payload {MAX_SIGNAL_BYTES // 1024} KiB; each may nest arrays "
                                f"and objects at most {MAX_DEPTH} levels deep (400 "
                                "`invalid_request`)."},
        "paths": paths,
        "components": {
            "schemas": schemas["$defs"],
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "`spacejobs tokens create EMAIL`"}},
        },
        "security": [{"bearer": []}],
    }


def _describe_submits(schemas: dict[str, Any]) -> None:
    """What a submit takes: the kinds (each with its own params: unknown fields are
    invalid_params; child-only kinds are not among them, nor named anywhere else in the
    document), and for the kind ``workflow`` its params, a graph of steps (``WorkflowParams``):
    each step a name, a kind (any a submit takes but ``workflow``), that kind's params and the
    places of the steps it waits for."""
    kinds = submittable_kinds()
    workflow = {"if": {"properties": {"kind": {"const": WORKFLOW_KIND}}, "required": ["kind"]},
                "then": {"properties": {"params": {"$ref": "#/components/schemas/WorkflowParams"}},
                         "required": ["params"]}}
    for body in ("SubmitJob", "BatchJob"):
        schemas[body]["properties"]["kind"]["enum"] = kinds
        if WORKFLOW_KIND in kinds:
            schemas[body]["allOf"] = [workflow]
    for part in ("StepNode", "FailureHandler"):
        schemas[part]["properties"]["kind"]["enum"] = [k for k in kinds if k != WORKFLOW_KIND]


def _operation(op: Operation, arguments: set[str]) -> dict[str, Any]:
    parameters = [{"name": name, "in": "path", "required": True,
                   "schema": PATH_SCHEMAS.get(name, {"type": "string", "format": "uuid"})}
                  for name in sorted(arguments)]
    parameters += [{"name": name, "in": "query", "required": False, "schema": schema}
                   for name, schema in op.query.items()]
    parameters += [{"name": name, "in": "header", "required": False, "schema": schema}
                   for name, schema in op.headers.items()]
    responses: dict[str, Any] = {}
    for status, (description, body) in op.answers.items():
        answer: dict[str, Any] = {"description": description}
        if body == "stream":
            answer["content"] = {"text/event-stream": {"schema": SERVER_SENT_EVENT}}
        elif body == "object":
            answer["content"] = {"application/json": {"schema": {"type": "object"}}}
        elif body == "result":
            answer["content"] = {"application/json": {"schema": _ref(JobResult)},
                                 "*/*": {"schema": {"type": "string", "format": "binary"}}}
        elif body is not None:
            answer["content"] = {"application/json": {"schema": _ref(body)}}
        if status == 202 and op.endpoint == "api.submit_job":
            answer["headers"] = {"Location": {"required": True, "schema": {"type": "string"}}}
        if status in op.links:
            answer["links"] = op.links[status]
        responses[str(status)] = answer
    codes = ANY_REQUEST if op.public else (*ANY_REQUEST, *op.errors)
    by_status: dict[int, list[str]] = {}
    for code in dict.fromkeys(codes):
        by_status.setdefault(HTTP_STATUS[code], []).append(code)
    for status, listed in sorted(by_status.items()):
        schema = {"$ref": "#/components/schemas/Error",
                  "properties": {"error": {"properties": {"code": {"enum": listed}}}}}
        responses[str(status)] = {"description": ", ".join(listed),
                                  "content": {"application/json": {"schema": schema}}}
        if status in (429, 503):
            responses[str(status)]["headers"] = RETRY_AFTER
    operation: dict[str, Any] = {"operationId": op.endpoint.split(".", 1)[1], "summary": op.summary,
                                 "parameters": parameters, "responses": responses}
    if op.body is not None:
        operation["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": _ref(op.body)}}}
    if op.raw_body:
        operation["requestBody"] = {"required": False, "content": {
            "application/json": {"schema": {"description": (
                f"any JSON, at most {MAX_SIGNAL_BYTES // 1024} KiB, nesting arrays and objects "
                f"at most {MAX_DEPTH} levels deep")}}}}
    if op.public:
        operation["security"] = []
    return operation


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}
