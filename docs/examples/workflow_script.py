"""A workflow from a script: three exports in parallel, then one step that gets their results
(a chord), submitted as one job and waited for as one.

    python docs/examples/workflow_script.py ORGANIZATION_ID USER_ID
"""

from __future__ import annotations

import sys
from uuid import UUID

from spacejobs import chain, chord, connect, sig


def run(organization_id: UUID, user_id: UUID) -> dict[str, object]:
    jobs = connect()
    canvas = chain(
        sig("bench.noop", name="prepare"),
        chord([sig("bench.sleep", seconds=0.2, name=f"part {n}") for n in range(3)],
              sig("bench.noop", name="merge")),
    )
    with jobs.engine.begin() as conn:  # all of it or nothing; the wake-up after COMMIT
        workflow = jobs.submit_workflow(conn, canvas, organization_id=organization_id,
                                        requested_by=user_id).job
    outcome = jobs.wait(workflow.id, timeout=60, organization_id=organization_id)
    print("workflow", outcome.job.status, outcome.job.progress)
    return {"status": outcome.job.status, "steps": outcome.result["steps"] if outcome.result else None}


if __name__ == "__main__":
    done = run(UUID(sys.argv[1]), UUID(sys.argv[2]))
    print(sorted(done["steps"] or {}))
    sys.exit(0 if done["status"] == "completed" else 1)
