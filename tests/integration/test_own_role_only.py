"""What compose.yaml relies on: a worker runs jobs with only its own role's URL, and beat
schedules sweeps with no database URL at all (no DATABASE_URL, no admin password)."""

from __future__ import annotations

from tests.conftest import submit
from tests.kit.stack import Stack


def test_worker_and_beat_need_no_admin_url(bare_stack: Stack) -> None:
    stack = bare_stack
    worker = stack.start_worker(concurrency=1, DATABASE_URL="",
                                SPACEJOBS_WORKER_DATABASE_URL=stack.worker_url)
    beat = stack.start_beat(DATABASE_URL="")
    client = stack.make_app().test_client()
    org = stack.org()
    anna = stack.user(org, role="owner")
    job = submit(client, org, anna, "bench.noop")
    stack.wait_for(job["id"], "completed")
    worker.wait_for_log("spacejobs.sweep[", timeout=20)   # sent by beat, run by the worker
    beat.wait_for_log("Sending due task", timeout=5)
    assert "Traceback" not in worker.output() + beat.output()
