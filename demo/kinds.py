"""The organization's projects, out (export) and in (import), with measured progress."""

from __future__ import annotations

import json
import tempfile
import time
import zipfile
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import Field, StringConstraints

from spacejobs.demo.projects import Projects
from spacejobs.models.jobs.canvas import chord, sig
from spacejobs.models.kinds import NoParams, Params, job_kind
from spacejobs.models.results.records import StoredResult
from spacejobs.tasks.engine.context import JobContext

WRITE_BATCH = 500  # export: projects written between two progress reports
ARCHIVE_BATCH = 100  # archive: projects written between two progress reports
#: an archive up to this size is built in memory, a larger one in a temporary file
ARCHIVE_IN_MEMORY = 8 * 1024 * 1024
IMPORT_BATCH = 50  # import: projects per transaction (and per progress report)


@job_kind(
    "projects_export",
    # read_only must never stop an owner from taking their data out
    org_states={"active", "read_only"},
    role="member",
    max_attempts=3,
    lease=timedelta(seconds=30),
    label="Export projects",
    description="A JSON file of every project of this organization.",
    start_from_pages=True,
)
def export_projects(ctx: JobContext, params: NoParams) -> dict[str, Any]:
    return export(ctx)


def export(ctx: JobContext, *, linger_seconds: float = 0.0) -> dict[str, Any]:
    """Read every project, then write the file: both stages report what they measured.

    ``linger_seconds`` spreads the writing over that long for the demo kind, so that a person
    can watch the page move and cancel half-way.
    """
    ctx.progress("reading projects")
    with ctx.tenant() as tenant:
        projects = Projects.of(tenant).list()
    total = len(projects)
    ctx.progress("reading projects", done=total, total=total)
    rows: list[dict[str, Any]] = []
    step = 1 if linger_seconds else WRITE_BATCH
    for start in range(0, total, step):
        chunk = projects[start:start + step]
        _linger(ctx, linger_seconds * len(chunk) / total, "writing the file", start, total)
        rows.extend(project.as_dict() for project in chunk)
        ctx.progress("writing the file", done=len(rows), total=total)
    if not total:
        ctx.progress("writing the file", done=0, total=0)
    return {"projects": rows}


@job_kind(
    "projects_archive",
    # like the export: read_only must never stop an owner from taking their data out
    org_states={"active", "read_only"},
    role="member",
    max_attempts=3,
    lease=timedelta(seconds=30),
    label="Archive projects (ZIP)",
    description="A ZIP file of every project of this organization: one JSON file per project, "
                "and a manifest that lists them.",
    start_from_pages=True,
)
def archive_projects(ctx: JobContext, params: NoParams) -> StoredResult:
    """A ZIP of the organization's projects, one JSON file per project and a manifest, kept in
    the results store and downloaded from the job's result."""
    ctx.progress("reading projects")
    with ctx.tenant() as tenant:
        projects = Projects.of(tenant).list()
    total = len(projects)
    ctx.progress("writing the archive", done=0, total=total)
    made = datetime.now(UTC)
    files = []
    with tempfile.SpooledTemporaryFile(max_size=ARCHIVE_IN_MEMORY) as archive:
        with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zipped:
            for done, project in enumerate(projects, start=1):
                name = f"projects/{project.id}.json"
                zipped.writestr(name, json.dumps(project.as_dict(), indent=2))
                files.append({"id": str(project.id), "name": project.name, "file": name})
                if done % ARCHIVE_BATCH == 0 or done == total:
                    ctx.progress("writing the archive", done=done, total=total)
            zipped.writestr("manifest.json", json.dumps({
                "organization_id": str(ctx.job.organization_id), "job_id": str(ctx.job.id),
                "created_at": made.isoformat(), "count": total, "projects": files}, indent=2))
        archive.seek(0)
        return ctx.store_result(archive, content_type="application/zip",
                                filename=f"projects-{made:%Y%m%d-%H%M%S}-{str(ctx.job.id)[:8]}.zip")


def _linger(ctx: JobContext, seconds: float, stage: str, done: int, total: int) -> None:
    """Wait, reporting the unchanged progress every half second: each report is also where a
    job learns that a cancel was asked for, so a slow job still stops within a second."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.5))
        ctx.progress(stage, done=done, total=total)


class ImportedProject(Params):
    name: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    description: Annotated[str, StringConstraints(max_length=2000)] = ""


class ImportParams(Params):
    projects: Annotated[list[ImportedProject], Field(min_length=1, max_length=500)]


@job_kind(
    "projects_import",
    org_states={"active"},
    role="admin",
    max_attempts=3,
    lease=timedelta(seconds=30),
    dedupable=True,
    params=ImportParams,
    label="Import projects",
    description='The file holds {"projects": [{"name": "…", "description": "…"}]}, 1 to 500 '
                "projects, at most 1 MiB.",
    start_from_pages=True,
)
def import_projects(ctx: JobContext, params: ImportParams) -> dict[str, Any]:
    """Import in batches, one transaction and one progress report each.

    Every row is keyed by the job's id, and a batch commits whole (with the lease check), so a
    retried attempt counts the rows its predecessors committed and goes on after them: a
    retry never imports a project twice.
    """
    total = len(params.projects)
    with ctx.tenant() as tenant:
        created = Projects.of(tenant).created_by_job(ctx.job.id)
    ctx.progress("importing projects", done=len(created), total=total)
    for start in range(len(created), total, IMPORT_BATCH):
        with ctx.tenant() as tenant:
            batch = [Projects.of(tenant).create(p.name, p.description, created_by_job=ctx.job.id)
                     for p in params.projects[start:start + IMPORT_BATCH]]
        created.extend(batch)
        ctx.progress("importing projects", done=len(created), total=total)
    return {"imported": len(created), "project_ids": [str(p.id) for p in created]}


class ReportParams(Params):
    max_parallel: Annotated[int, Field(ge=1, le=16)] = 4


@job_kind(
    "projects_report",
    org_states={"active", "read_only"},
    role="member",
    # A workflow waits for its steps without a worker; a worker killed in one of its short runs
    # costs it an attempt, and the next carries on with the steps already made.
    max_attempts=10,
    lease=timedelta(seconds=30),
    params=ReportParams,
    label="Projects report",
)
def report_projects(ctx: JobContext, params: ReportParams) -> dict[str, Any]:
    """A chord: a report per project, one step each (at most ``max_parallel`` at a time), then
    one step that merges them. Its progress is the steps ended out of all of them; its result
    the merge's, the reports in project order. Every step is a job of its own, run as the
    requester with its kind's re-checks; one that fails does not stop the others (run_all),
    and the report then fails listing each."""
    # The projects as they were when the report began: a later run (after a wait) must build
    # the same graph (the step rule).
    project_ids = ctx.step("projects", lambda: _project_ids(ctx))
    if not project_ids:
        return merged_reports([])  # nothing to wait for
    parts = [sig("projects_report.project", name=f"project {project_id}", project_id=project_id)
             for project_id in project_ids]
    done = ctx.workflow(chord(parts, sig("projects_report.merge", name="merge")),
                        policy="run_all", max_parallel=params.max_parallel)
    merged: dict[str, Any] = done["result"]
    return merged


def _project_ids(ctx: JobContext) -> list[str]:
    with ctx.tenant() as tenant:
        return [str(project.id) for project in Projects.of(tenant).list()]


class ProjectReportParams(Params):
    # A UUID, checked as one before the job exists: text that merely looks like one would
    # reach PostgreSQL, whose refusal quotes it.
    project_id: UUID


@job_kind("projects_report.project", org_states={"active", "read_only"}, role="member",
          max_attempts=3, lease=timedelta(seconds=30), params=ProjectReportParams,
          child_only=True)
def report_project(ctx: JobContext, params: ProjectReportParams) -> dict[str, Any]:
    """One project's report: a part of projects_report."""
    with ctx.tenant() as tenant:
        project = Projects.of(tenant).get(params.project_id)
    if project is None:
        return {"project_id": str(params.project_id), "missing": True}
    words = len(project.description.split())
    return {"project_id": str(project.id), "name": project.name, "description_words": words}


@job_kind("projects_report.merge", org_states={"active", "read_only"}, role="member",
          max_attempts=3, lease=timedelta(seconds=30), child_only=True)
def merge_reports(ctx: JobContext, params: NoParams) -> dict[str, Any]:
    """The chord's callback of projects_report: the projects' reports (its inputs, in project
    order) and their totals."""
    return merged_reports([report for report in ctx.inputs if isinstance(report, dict)])


def merged_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    return {"projects": reports,
            "count": len(reports),
            "missing": sum(bool(report.get("missing")) for report in reports),
            "description_words": sum(int(report.get("description_words", 0)) for report in reports)}


class SlowExportParams(Params):
    seconds: Annotated[float, Field(ge=1, le=600, title="Seconds it should take",
                                    description="How long the writing of the file takes.")] = 20.0


# Slow enough to watch: the projects export, lingering over each project so the live job page
# visibly moves and a person has time to press Cancel (the demo's own).
@job_kind(
    "demo.slow_export",
    org_states={"active", "read_only"},
    role="member",
    max_attempts=3,
    lease=timedelta(seconds=30),
    params=SlowExportParams,
    label="Slow export (demo)",
    description="The same export, slowed down so you can watch it and cancel it.",
    start_from_pages=True,
)
def slow_export(ctx: JobContext, params: SlowExportParams) -> dict[str, Any]:
    return export(ctx, linger_seconds=params.seconds)


class ApprovalRequest(Params):
    request: Annotated[str, Field(min_length=1, max_length=200, title="What needs approving",
                                  description="One line: the approver reads it on the job's page.")]
    hours: Annotated[int, Field(ge=1, le=168, title="Hours to answer",
                                description="Without an answer by then, the job fails.")] = 24


class ApprovalAnswer(Params):
    decision: Literal["approve", "reject"] = Field(title="Decision")
    comment: Annotated[str, Field(max_length=500, title="Comment",
                                  description="Optional: why, for whoever started it.")] = ""


# A person's approval, answered on the job's page: the job waits for its "answer" signal without
# holding a worker, and trusts who the database says sent it, never the payload (the demo's own).
@job_kind(
    "demo.approval",
    org_states={"active"},
    role="admin",
    max_attempts=3,
    lease=timedelta(seconds=30),
    params=ApprovalRequest,
    label="Approval (demo)",
    description="Ask for an approval: the job waits until an owner or an admin answers it on its "
                "page.",
    start_from_pages=True,
    signals={"answer": ApprovalAnswer},
)
def approval(ctx: JobContext, params: ApprovalRequest) -> dict[str, Any]:
    ctx.progress("waiting for an answer")
    signal = ctx.receive_signal("answer", timeout=params.hours * 3600)
    answer = ApprovalAnswer.model_validate(signal.payload)
    return {"request": params.request, "decision": answer.decision, "comment": answer.comment,
            "answered_by": str(signal.sent_by), "answerer_role": signal.sender_role}
