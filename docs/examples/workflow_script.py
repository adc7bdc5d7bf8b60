"""Workflows from a script: a chain, a chord and a graph of Space's own kinds (the demo's, with
SPACEJOBS_DEMO_KINDS=1, as `spacejobs demo` and compose.yaml run it), each submitted as ONE job
and waited for as one.

    python docs/examples/workflow_script.py ORGANIZATION_ID USER_ID chain|chord|graph

The user must be an admin or an owner of the organization: a workflow's submit needs the role
of each of its steps, and an import needs an admin.
"""

from __future__ import annotations

import sys
from typing import Any
from uuid import UUID

from spacejobs import chain, chord, connect, graph, sig


def projects(*names: str) -> dict[str, Any]:
    """An import's params: a project for each name."""
    return {"projects": [{"name": name} for name in names]}


CANVASES = {
    # Each step waits for the one before (and gets its result as ctx.inputs).
    "chain": chain(sig("projects_import", projects("Apollo", "Gemini"), name="import"),
                   sig("projects_export", name="export")),
    # Two imports side by side, then one report once both have completed.
    "chord": chord([sig("projects_import", projects("Mercury"), name="import mercury"),
                    sig("projects_import", projects("Vostok"), name="import vostok")],
                   sig("projects_report", name="report")),
    # Named steps, each with the names of the steps it waits for.
    "graph": graph({"seed": (sig("projects_import", projects("Skylab")), []),
                    "export": (sig("projects_export"), ["seed"]),
                    "report": (sig("projects_report", max_parallel=2), ["seed"])}),
}


def run(organization_id: UUID, user_id: UUID, shape: str) -> dict[str, Any]:
    jobs = connect()
    with jobs.engine.begin() as conn:  # all of it or nothing; the wake-up after COMMIT
        workflow = jobs.submit_workflow(conn, CANVASES[shape], organization_id=organization_id,
                                        requested_by=user_id).job
    outcome = jobs.wait(workflow.id, timeout=120, organization_id=organization_id)
    print("workflow", outcome.job.status, outcome.job.progress)
    return {"status": outcome.job.status,
            "steps": outcome.result["steps"] if outcome.result else None}


if __name__ == "__main__":
    done = run(UUID(sys.argv[1]), UUID(sys.argv[2]), sys.argv[3])
    print(sorted(done["steps"] or {}))
    sys.exit(0 if done["status"] == "completed" else 1)
