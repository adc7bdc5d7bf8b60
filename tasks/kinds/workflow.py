"""The ``workflow`` kind: a graph of steps kept in PostgreSQL (models/jobs/workflows.py says how
it runs). Registered by default (SPACEJOBS_KIND_MODULES); submitted through
``Jobs.submit_workflow``, since a workflow's params are a compiled canvas, not a form."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from spacejobs.models.jobs.context import JobContext
from spacejobs.models.jobs.workflows import WorkflowParams, run_workflow
from spacejobs.models.kinds import job_kind


# Each step re-checks its own kind's organization states and role when it runs; the workflow
# itself only coordinates, so it may run wherever one of its steps may.
@job_kind("workflow", org_states={"active", "read_only"}, role="member", max_attempts=10,
          lease=timedelta(seconds=30), dedupable=False)
def workflow(ctx: JobContext, params: WorkflowParams) -> dict[str, Any]:
    return run_workflow(ctx, params.steps, params.policy)
