"""Start a job from a script and wait for its result.

    python docs/examples/script_submit.py ORGANIZATION_ID USER_ID

with the same DATABASE_URL and REDIS_URL as the workers (the demo writes them to a file in its
data directory). The user must be a current member of the organization; the job runs as theirs.
"""

from __future__ import annotations

import sys
from uuid import UUID

from spacejobs import connect


def export_projects(organization_id: UUID, user_id: UUID) -> dict[str, object]:
    jobs = connect()  # once per process: engines, kinds and the wake-up publisher
    # The submit runs in a transaction of the script's own; the row, its event and the audit
    # entry commit together, and only then does the wake-up go out.
    with jobs.engine.begin() as conn:
        submitted = jobs.submit(conn, "projects_export", organization_id=organization_id,
                                requested_by=user_id)
    print("submitted", submitted.job.id, submitted.job.status)
    # No polling: wait() hears the finish (LISTEN/NOTIFY) and reads the row once.
    outcome = jobs.wait(submitted.job.id, timeout=60, organization_id=organization_id)
    print("ended", outcome.job.status)
    return {"status": outcome.job.status, "result": outcome.result}


if __name__ == "__main__":
    done = export_projects(UUID(sys.argv[1]), UUID(sys.argv[2]))
    sys.exit(0 if done["status"] == "completed" else 1)
