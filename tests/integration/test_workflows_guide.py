"""The workflows guide's examples (docs/guides/workflows.md), run for real: the Python script as
a reader runs it, as its own process against the demo's kinds alone (no benchmark or test
kinds), and each JSON body posted to the HTTP API as the guide shows it, then its steps and
their results read back. The script's canvases and the JSON bodies are the same workflows."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from typing import Any

import pytest
from sqlalchemy import text

from spacejobs.models.jobs.canvas import WorkflowParams, chain, sig, workflow_params
from tests.kit.processes import REPO_ROOT
from tests.kit.stack import Stack

EXAMPLES = REPO_ROOT / "docs" / "examples"
SCRIPT = EXAMPLES / "workflow_script.py"
SHAPES = {
    "chain": ["import", "export"],
    "chord": ["import mercury", "import vostok", "report"],
    "graph": ["seed", "export", "report"],
}


@pytest.fixture(scope="module")
def client(stack: Stack) -> Any:
    return stack.make_app().test_client()


def body_of(shape: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((EXAMPLES / f"workflow_{shape}.json").read_text())
    return body


@pytest.mark.parametrize("shape", SHAPES)
def test_the_guides_json_and_python_say_the_same_workflow(shape):
    canvases = runpy.run_path(str(SCRIPT))["CANVASES"]
    from_python = WorkflowParams.model_validate(workflow_params(canvases[shape]))
    from_json = WorkflowParams.model_validate(body_of(shape)["params"])
    assert from_json == from_python
    assert [step.name for step in from_json.steps] == SHAPES[shape]


@pytest.mark.parametrize("shape", SHAPES)
def test_the_script_runs_each_shape_against_the_demos_kinds_alone(stack: Stack, shape):
    org = stack.org()
    anna = stack.user(org, role="admin")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(org), str(anna.id), shape], cwd=REPO_ROOT,
        env=stack.env(SPACEJOBS_BENCH_KINDS="0", SPACEJOBS_EXTRA_KIND_MODULES=""),
        capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    status, steps = done.stdout.splitlines()[-2:]
    total = len(SHAPES[shape])
    assert status == f"workflow completed {{'done': {total}, 'stage': 'steps', 'total': {total}}}"
    assert steps == str(sorted(SHAPES[shape]))


@pytest.mark.parametrize("shape", SHAPES)
def test_each_json_body_runs_over_http_and_its_steps_and_results_read_back(stack: Stack, client,
                                                                          shape):
    org = stack.org()
    anna = stack.user(org, role="admin")
    base = f"/api/v1/orgs/{org}/jobs"
    submitted = client.post(base, json=body_of(shape), headers=anna.auth)
    assert submitted.status_code == 202, submitted.get_json()
    workflow = submitted.get_json()
    stack.wait_for(workflow["id"], "completed", timeout=120)
    steps = client.get(workflow["links"]["steps"], headers=anna.auth).get_json()
    assert [(s["name"], s["status"]) for s in steps["steps"]] == [
        (name, "completed") for name in SHAPES[shape]]
    results = client.get(workflow["links"]["steps"] + "/results", headers=anna.auth).get_json()
    by_name = {r["name"]: r["result"] for r in results["results"]}
    assert list(by_name) == SHAPES[shape]
    imported = [r for name, r in by_name.items() if name.startswith(("import", "seed"))]
    assert all(r["imported"] >= 1 for r in imported)
    whole = client.get(workflow["links"]["result"], headers=anna.auth).get_json()["result"]
    assert whole["steps"] == by_name  # the same results as the workflow's own


def test_a_plain_member_cannot_start_the_guides_workflows_the_import_needs_an_admin(
        stack: Stack, client):
    org = stack.org()
    vera = stack.user(org, role="member")
    refused = client.post(f"/api/v1/orgs/{org}/jobs", json=body_of("chain"), headers=vera.auth)
    assert refused.status_code == 403
    assert refused.get_json()["error"] == {
        "code": "insufficient_role", "step": 0,
        "message": "Your role in this organization does not allow this operation."}
    assert stack.count_jobs(org) == 0


def test_the_guides_failure_handler_and_resume_run_over_http(stack: Stack, client):
    """docs/examples/workflow_on_failure.json as the guide tells it: its import step fails when
    it runs (its requester lost the admin role after the submit: each step re-checks its own
    kind's rules), the handler runs once, and once the role is back, the resume runs the import
    and what follows it, not the export that completed."""
    org = stack.org()
    anna = stack.user(org, role="admin")
    body = json.loads((EXAMPLES / "workflow_on_failure.json").read_text())
    from_python = workflow_params(
        chain(sig("projects_export", name="export before"),
              sig("projects_import", name="import", projects=[{"name": "Vostok"}]),
              sig("projects_export", name="export after")).on_failure(sig("projects_export")))
    assert WorkflowParams.model_validate(body["params"]) == WorkflowParams.model_validate(
        from_python)

    def set_role(role: str) -> None:
        with stack.admin() as conn:
            conn.execute(text("UPDATE memberships SET role = :role"
                              " WHERE organization_id = :org AND user_id = :user"),
                         {"role": role, "org": org, "user": anna.id})

    with stack.workers_paused():
        submitted = client.post(f"/api/v1/orgs/{org}/jobs", json=body, headers=anna.auth)
        assert submitted.status_code == 202, submitted.get_json()
        set_role("member")
    failed = submitted.get_json()
    assert stack.wait_for(failed["id"], "failed", timeout=60)["error_code"] == "steps_failed"
    steps = client.get(failed["links"]["steps"], headers=anna.auth).get_json()["steps"]
    assert [(s["name"], s["status"], s["error_code"]) for s in steps] == [
        ("export before", "completed", None), ("import", "failed", "insufficient_role"),
        ("export after", "skipped", None)]
    with stack.admin() as conn:
        handlers = conn.execute(text("SELECT h.handler_id FROM job_failure_handlers h"
                                     " WHERE h.workflow_id = :id"), {"id": failed["id"]}).all()
    assert len(handlers) == 1
    assert stack.wait_for(handlers[0].handler_id, "completed", timeout=60)

    set_role("admin")
    resumed = client.post(f"/api/v1/orgs/{org}/jobs/{failed['id']}/resume", headers=anna.auth)
    assert resumed.status_code == 202, resumed.get_json()
    again = resumed.get_json()
    stack.wait_for(again["id"], "completed", timeout=60)
    steps = client.get(again["links"]["steps"], headers=anna.auth).get_json()["steps"]
    assert [(s["name"], s["status"]) for s in steps] == [
        ("export before", "completed"), ("import", "completed"), ("export after", "completed")]
    # The export that completed is the first run's own job, not run again.
    assert steps[0]["job_id"] == client.get(failed["links"]["steps"], headers=anna.auth
                                            ).get_json()["steps"][0]["job_id"]
