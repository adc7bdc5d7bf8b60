"""The waiting guide's example (docs/examples/approval.py), run for real by a worker and beat
that load it as the guide says: it prepares its draft once, waits for the approval without a
worker, takes the signal sent over HTTP, sleeps durably, and completes."""

from __future__ import annotations

import importlib
import os
import sys

import pytest
from sqlalchemy import text

from tests.conftest import submit
from tests.kit.processes import REPO_ROOT
from tests.kit.stack import Stack
from tests.kit.waiting import wait_until

EXAMPLES = REPO_ROOT / "docs" / "examples"


@pytest.fixture(scope="module")
def loaded(bare_stack: Stack):
    """Worker and beat with the example's module; this process registers it too (the web's
    submit checks its params)."""
    env = {"PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(EXAMPLES)]),
           "SPACEJOBS_EXTRA_KIND_MODULES": "tests.kinds,approval"}
    sys.path.insert(0, str(EXAMPLES))
    importlib.import_module("approval")
    worker, beat = bare_stack.start_worker(**env), bare_stack.start_beat(**env)
    yield
    bare_stack.retire(worker, beat)
    sys.path.remove(str(EXAMPLES))


def test_the_approval_example_waits_for_its_signal_and_its_timer_and_completes(
        bare_stack: Stack, loaded):
    stack = bare_stack
    org = stack.org()
    vera = stack.user(org, role="member")
    anna = stack.user(org, role="admin")
    client = stack.make_app().test_client()
    client.post(f"/api/v1/orgs/{org}/projects", json={"name": "Apollo"}, headers=vera.auth)
    job = submit(client, org, vera, "approval", {"title": "Q4", "publish_after": 1})
    waiting = stack.wait_for(job["id"], "waiting", timeout=30)
    assert waiting["wait_signal"] == "approved"
    url = f"/api/v1/orgs/{org}/jobs/{job['id']}/signals/approved"
    # The requester approves her own draft, claiming to be anna: taken, and passed over.
    assert client.post(url, json={"by": str(anna.id)}, headers=vera.auth).status_code == 202

    def second_wait() -> bool:
        with stack.admin() as conn:
            return conn.execute(text(
                "SELECT status = 'waiting' AND EXISTS (SELECT 1 FROM job_steps s WHERE s.job_id"
                " = j.id AND s.name = 'signal:approved#2:deadline') FROM jobs j WHERE j.id = :id"),
                {"id": job["id"]}).scalar_one()

    wait_until(second_wait, 30, what="the second wait for an approval")
    assert client.post(url, json={}, headers=anna.auth).status_code == 202
    done = stack.wait_for(job["id"], "completed", timeout=30)
    assert done["result"] == {"draft": {"title": "Q4", "projects": 1},
                              "approved_by": str(anna.id), "published": True}
    waits = [e["to_status"] for e in stack.events(job["id"])].count("waiting")
    assert done["attempts"] == 1  # every wait gave its attempt back
    assert waits >= 3  # two signals and the timer (a signal already sent skips its wait)
    with stack.admin() as conn:
        steps = conn.execute(text("SELECT name FROM job_steps WHERE job_id = :id ORDER BY name"),
                             {"id": job["id"]}).scalars().all()
    assert steps == ["prepare the draft", "signal:approved#1", "signal:approved#1:deadline",
                     "signal:approved#2", "signal:approved#2:deadline", "sleep#1"]
