"""The guides' examples (docs/examples/), run for real: the "writing a kind" guide's kind is loaded
through SPACEJOBS_EXTRA_KIND_MODULES by `spacejobs web` and a Celery worker, and its script
submits a job over HTTP and reads the result back, exactly as the page tells a reader to."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.kit.processes import REPO_ROOT
from tests.kit.stack import Stack

EXAMPLES = Path(REPO_ROOT) / "docs" / "examples"


@pytest.fixture(scope="module")
def kind_env(bare_stack: Stack) -> dict[str, str]:
    """What the guide says to set: the example's folder importable, its module named."""
    return bare_stack.env(
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(EXAMPLES)]),
        SPACEJOBS_EXTRA_KIND_MODULES="word_count")


@pytest.fixture(scope="module")
def web(bare_stack: Stack, kind_env: dict[str, str]) -> Iterator[str]:
    """`spacejobs web` and one worker, both with the example kind, on the module's stack."""
    worker = bare_stack.start_worker(PYTHONPATH=kind_env["PYTHONPATH"],
                                     SPACEJOBS_EXTRA_KIND_MODULES=kind_env["SPACEJOBS_EXTRA_KIND_MODULES"])
    proc, url = bare_stack.start_web(env=kind_env)
    yield url
    bare_stack.retire(proc, worker)


def test_the_kind_of_the_guide_runs_on_a_worker_and_its_result_is_read_back(
        bare_stack: Stack, web: str, kind_env: dict[str, str]) -> None:
    org = bare_stack.org()
    member = bare_stack.user(org, "member")
    projects = {"Apollo": "Rockets and more rockets: crews ride rockets to orbit, to the Moon and back.",
                "Gemini": "Crews train and crews fly rockets to orbit."}
    for name, description in projects.items():
        created = requests.post(f"{web}/api/v1/orgs/{org}/projects", headers=member.auth,
                                json={"name": name, "description": description}, timeout=10)
        assert created.status_code == 201, created.text

    ran = subprocess.run(
        [sys.executable, str(EXAMPLES / "word_count_submit.py")], capture_output=True, text=True,
        timeout=90, cwd=REPO_ROOT,
        env=kind_env | {"SPACEJOBS_URL": web, "SPACEJOBS_TOKEN": member.token, "SPACEJOBS_ORG": str(org)})
    assert ran.returncode == 0, ran.stderr[-3000:]
    answer = json.loads(ran.stdout)

    assert answer["kind"] == "word_count"
    # the 3 commonest words of at least 4 letters in both descriptions (the params the script
    # sent): "and" and "to", three times each, are too short
    assert answer["result"] == {"projects": 2, "words": [
        {"word": "rockets", "count": 4}, {"word": "crews", "count": 3}, {"word": "orbit", "count": 2}]}
    row = bare_stack.job_row(answer["job_id"])
    assert (row["status"], row["attempts"]) == ("completed", 1)
    assert [e["to_status"] for e in bare_stack.events(answer["job_id"])] == ["queued", "leased", "completed"]


def test_the_params_model_of_the_guide_refuses_what_it_does_not_allow(bare_stack: Stack, web: str) -> None:
    org = bare_stack.org()
    member = bare_stack.user(org, "member")
    for params in ({"top": 0}, {"top": 5, "colour": "red"}):
        refused = requests.post(f"{web}/api/v1/orgs/{org}/jobs", headers=member.auth,
                                json={"kind": "word_count", "params": params}, timeout=10)
        assert (refused.status_code, refused.json()["error"]["code"]) == (400, "invalid_params")
    assert bare_stack.count_jobs(org) == 0


def test_the_kind_of_the_guide_is_started_from_the_jobs_page_with_its_form(
        bare_stack: Stack, web: str) -> None:
    """The guide's label, description and start_from_pages: a member finds its card on the Jobs
    page, with a field per param (title, description, bounds, default), and starts it there."""
    org = bare_stack.org()
    member = bare_stack.user(org, "member", password="the guide's long password")
    browser = requests.Session()
    login = browser.get(f"{web}/login", timeout=10)
    signed_in = browser.post(f"{web}/login", timeout=10, allow_redirects=False, data={
        "email": member.email, "password": "the guide's long password",
        "csrf": re.search(r'name="csrf" value="([^"]+)"', login.text).group(1)})
    assert signed_in.status_code == 302
    page = browser.get(f"{web}/orgs/{org}/jobs", timeout=10).text
    assert "<h2>Count words</h2>" in page
    assert "The most common words in the projects&#39; descriptions." in page
    assert '>How many words <span class="muted">(optional)</span></label>' in page
    assert 'name="top" type="number" step="1" min="1" max="100"' in page
    started = browser.post(f"{web}/orgs/{org}/jobs", timeout=10, allow_redirects=False, data={
        "kind": "word_count", "top": "3", "min_length": "",
        "csrf": re.search(r'name="csrf" value="([^"]+)"', page).group(1)})
    assert started.status_code == 302, started.text[-2000:]
    job_id = started.headers["Location"].rsplit("/", 1)[1]
    bare_stack.wait_for(job_id, "completed", timeout=30)
    assert "Count words" in browser.get(f"{web}{started.headers['Location']}", timeout=10).text
