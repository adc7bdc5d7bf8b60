"""What compose.yaml relies on: a worker runs jobs, and beat runs the maintenance chores, each
with only the worker role's URL (no DATABASE_URL, no admin password)."""

from __future__ import annotations

from tests.conftest import submit
from tests.kit.stack import Stack


def test_worker_and_beat_need_no_admin_url(bare_stack: Stack) -> None:
    stack = bare_stack
    worker = stack.start_worker(concurrency=1, DATABASE_URL="",
                                SPACEJOBS_WORKER_DATABASE_URL=stack.worker_url)
    beat = stack.start_beat(DATABASE_URL="", SPACEJOBS_WORKER_DATABASE_URL=stack.worker_url)
    client = stack.make_app().test_client()
    org = stack.org()
    anna = stack.user(org, role="owner")
    job = submit(client, org, anna, "bench.noop")
    stack.wait_for(job["id"], "completed")
    beat.wait_for_log("maintenance ran in", timeout=20)  # beat runs the chores itself (tasks/beat.py)
    assert "Traceback" not in worker.output() + beat.output()
