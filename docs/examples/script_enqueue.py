"""Start jobs from a script that has nothing of its own to commit with them.

    python docs/examples/script_enqueue.py ORGANIZATION_ID USER_ID [COUNT]

``jobs.enqueue`` is ``jobs.submit`` in a transaction of its own: the same checks (the user's
current membership, the kind's rules, the quota) and the same rows (the job, its event, the
audit entry), in one statement and one round trip to PostgreSQL. It returns once the job is
committed, then sends the wake-up.
"""

from __future__ import annotations

import sys
from uuid import UUID

from spacejobs import connect


def start_exports(organization_id: UUID, user_id: UUID, count: int) -> list[str]:
    jobs = connect()  # once per process
    started = []
    for _ in range(count):
        submitted = jobs.enqueue("projects_export", organization_id=organization_id,
                                 requested_by=user_id)
        started.append(str(submitted.job.id))
    # Each is committed already: a crash of this script from here on loses none of them.
    for job_id in started:
        outcome = jobs.wait(UUID(job_id), timeout=60, organization_id=organization_id)
        print(job_id, outcome.job.status)
    return started


if __name__ == "__main__":
    start_exports(UUID(sys.argv[1]), UUID(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 3)
