"""The Python API guide's examples (docs/examples/), run as a newcomer would run them: as their
own processes, configured only by the environment, against a stack with a real worker. If an
example stops working as the guide shows it, this fails."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.kit.processes import REPO_ROOT
from tests.kit.stack import Stack

EXAMPLES = REPO_ROOT / "docs" / "examples"


def run(stack: Stack, *argv: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=REPO_ROOT, env=stack.env(),
                          capture_output=True, text=True, timeout=timeout)


def test_the_script_example_submits_and_waits_for_its_result(stack: Stack):
    org = stack.org()
    anna = stack.user(org, role="owner")
    done = run(stack, str(EXAMPLES / "script_submit.py"), str(org), str(anna.id))
    assert done.returncode == 0, done.stderr[-2000:]
    submitted, ended = done.stdout.splitlines()[-2:]
    job_id = submitted.split()[1]
    assert submitted.endswith(" queued") and ended == "ended completed"
    row = stack.job_row(job_id)
    assert (row["status"], row["requested_by"], row["organization_id"]) == ("completed", anna.id, org)


def test_the_script_example_refuses_a_stranger_and_writes_nothing(stack: Stack):
    org = stack.org()
    stranger = stack.user(stack.org(), role="owner")
    done = run(stack, str(EXAMPLES / "script_submit.py"), str(org), str(stranger.id))
    assert done.returncode != 0 and "NotFound" in done.stderr
    assert stack.count_jobs(org) == 0


def test_the_enqueue_example_commits_each_job_on_its_own(stack: Stack):
    org = stack.org()
    anna = stack.user(org, role="member")
    done = run(stack, str(EXAMPLES / "script_enqueue.py"), str(org), str(anna.id), "3")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()[-3:]
    assert [line.split()[1] for line in lines] == ["completed"] * 3
    for line in lines:
        row = stack.job_row(line.split()[0])
        assert (row["status"], row["requested_by"], row["organization_id"]) == (
            "completed", anna.id, org)


def test_the_enqueue_example_refuses_a_stranger_and_writes_nothing(stack: Stack):
    org = stack.org()
    stranger = stack.user(stack.org(), role="owner")
    done = run(stack, str(EXAMPLES / "script_enqueue.py"), str(org), str(stranger.id), "1")
    assert done.returncode != 0 and "NotFound" in done.stderr
    assert stack.count_jobs(org) == 0


# The Flask example, driven through its own test client in a process of its own: it starts a
# report as a member, reads it back until it completed, and is refused for a stranger.
FLASK_DRIVER = """
import json, runpy, sys, time
example = runpy.run_path(sys.argv[1])
client = example["app"].test_client()
org, member, stranger = sys.argv[2:5]
started = client.post(f"/orgs/{org}/reports", headers={"X-User-Id": member})
out = {"started": [started.status_code, started.get_json()]}
job = started.get_json()["job_id"]
example["jobs"].wait(__import__("uuid").UUID(job), 60, organization_id=__import__("uuid").UUID(org))
shown = client.get(f"/orgs/{org}/reports/{job}", headers={"X-User-Id": member})
out["shown"] = [shown.status_code, shown.get_json()]
peek = client.get(f"/orgs/{org}/reports/{job}", headers={"X-User-Id": stranger})
out["stranger"] = [peek.status_code, peek.get_json()]
refused = client.post(f"/orgs/{org}/reports", headers={"X-User-Id": stranger})
out["stranger_start"] = [refused.status_code, refused.get_json()]
print(json.dumps(out))
"""


def test_the_flask_view_example_starts_shows_and_refuses(stack: Stack):
    org = stack.org()
    member = stack.user(org, role="member")
    stranger = stack.user(stack.org(), role="owner")
    done = run(stack, "-c", FLASK_DRIVER, str(EXAMPLES / "flask_view.py"), str(org), str(member.id),
               str(stranger.id))
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["started"][0] == 202 and out["started"][1]["status"] == "queued"
    status, body = out["shown"]
    assert status == 200 and body["status"] == "completed"
    assert "result" in body  # a member holds the report's role
    assert out["stranger"] == [404, {"error": "not_found", "message": "Not found."}]
    assert out["stranger_start"][0] == 404
    assert stack.count_jobs(org) == 1

