"""Flow control from the Python API: a kind that calls a partner's API at a bounded rate, a
sequence of one account's syncs, and a debounced sync.

    python docs/examples/partner_sync.py ORGANIZATION_ID USER_ID

Workers load the kind when this module is named in SPACEJOBS_EXTRA_KIND_MODULES (here
`partner_sync`, with this folder on PYTHONPATH); the script part submits as the user and waits.
tests/integration/test_flow_control_guide.py runs both.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any
from uuid import UUID

from pydantic import Field

from spacejobs import JobContext, Params, job_kind


class SyncParams(Params):
    account: Annotated[str, Field(min_length=1, max_length=100)]
    reason: Annotated[str, Field(max_length=200)] = ""


# The partner allows 2 calls every 2 seconds per customer: at most 2 of these start in one
# organization in any 2 s, on every worker together. The rest wait, queued, in order.
@job_kind("partner_sync", org_states={"active"}, rate_limit="2 per 2 seconds", params=SyncParams)
def partner_sync(ctx: JobContext, params: SyncParams) -> dict[str, Any]:
    return {"account": params.account, "reason": params.reason}


def main(organization_id: UUID, user_id: UUID) -> list[dict[str, Any]]:
    from spacejobs import connect

    jobs = connect()
    who = {"organization_id": organization_id, "requested_by": user_id}
    with jobs.engine.begin() as conn:
        # One account's syncs run one at a time, in this order, each after the last one ended.
        ordered = [jobs.submit(conn, "partner_sync", {"account": "acme", "reason": f"import {n}"},
                               sequence_key="acme", **who).job.id for n in range(3)]
    # An edit asks for a sync; a second edit within the debounce replaces the first one's
    # params and moves its start, so one sync runs with the latest params.
    with jobs.engine.begin() as conn:
        first = jobs.submit(conn, "partner_sync", {"account": "globex", "reason": "edit 1"},
                            dedup_key="globex", debounce_seconds=1, **who)
    with jobs.engine.begin() as conn:
        second = jobs.submit(conn, "partner_sync", {"account": "globex", "reason": "edit 2"},
                             dedup_key="globex", debounce_seconds=1, **who)
    print("debounced", second.debounced, second.job.id == first.job.id)
    ended = []
    for job_id in [*ordered, first.job.id]:
        outcome = jobs.wait(job_id, timeout=60, organization_id=organization_id)
        print("ended", job_id, outcome.job.status, outcome.result["reason"])
        ended.append({"id": str(job_id), "status": outcome.job.status})
    return ended


if __name__ == "__main__":
    done = main(UUID(sys.argv[1]), UUID(sys.argv[2]))
    sys.exit(0 if all(job["status"] == "completed" for job in done) else 1)
