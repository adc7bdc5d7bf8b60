"""The ``workflow`` kind: a graph of steps kept in PostgreSQL (spacejobs.tasks.engine.workflows says
how it runs). Registered by default (SPACEJOBS_KIND_MODULES); submitted through
``Jobs.submit_workflow``, since a workflow's params are a compiled canvas, not a form."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from spacejobs.models.jobs.canvas import WorkflowParams
from spacejobs.models.kinds import job_kind
from spacejobs.tasks.engine.context import JobContext
from spacejobs.tasks.engine.workflows import run_workflow


# Each step re-checks its own kind's organization states and role when it runs; the workflow
# itself only coordinates, so it may run wherever one of its steps may.
@job_kind("workflow", org_states={"active", "read_only"}, role="member", max_attempts=10,
          lease=timedelta(seconds=30), dedupable=False, label="Workflow")
def workflow(ctx: JobContext, params: WorkflowParams) -> dict[str, Any]:
    return run_workflow(ctx, params.steps, params.policy, on_failure=params.on_failure)
