"""The organization's projects, out (export) and in (import)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from pydantic import Field, StringConstraints

from models.jobs.context import JobContext
from models.kinds import NoParams, Params, job_kind


@job_kind(
    "projects_export",
    # read_only must never stop an owner from taking their data out
    org_states={"active", "read_only"},
    role="member",
    max_attempts=3,
    lease=timedelta(seconds=30),
)
def export_projects(ctx: JobContext, params: NoParams) -> dict[str, Any]:
    with ctx.tenant() as tenant:
        projects = tenant.projects.list()
    ctx.progress("read projects", done=len(projects), total=len(projects))
    return {"projects": [project.as_dict() for project in projects]}


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
)
def import_projects(ctx: JobContext, params: ImportParams) -> dict[str, Any]:
    total = len(params.projects)
    with ctx.tenant() as tenant:
        # An earlier attempt whose finish was lost may already have committed the rows:
        # writes are keyed by job id so a retry never imports twice.
        created = tenant.projects.created_by_job(ctx.job.id)
        if not created:
            created = [
                tenant.projects.create(p.name, p.description, created_by_job=ctx.job.id)
                for p in params.projects
            ]
    ctx.progress("imported projects", done=len(created), total=total)
    return {"imported": len(created), "project_ids": [str(p.id) for p in created]}
