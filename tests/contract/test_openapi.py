"""The HTTP contract, machine-checked: schemathesis (its own runner, `schemathesis run`) drives
the served app from the app's OpenAPI document (GET /api/v1/openapi.json) with a member's
token: examples, coverage (boundary and invalid values), fuzzing, and stateful sequences that
follow the document's links (submit, then read, cancel, stream, fetch the result...). Seeded
and bounded in time, so a run is repeatable and short.

Every answer must: not be a 5xx; have a status, content type, headers and body that the
document gives for that operation; and, for a 4xx, carry an ``error.code`` of the error table
whose HTTP status is the one answered (tests/contract/hooks.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import requests

from spacejobs.webapp.errors import HTTP_STATUS
from tests.conftest import served
from tests.kit.processes import REPO_ROOT as ROOT
from tests.kit.stack import Stack

CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_headers_conformance,response_schema_conformance,error_code_is_stable")


@pytest.fixture(scope="module")
def target(stack: Stack):
    """The app on a real port; an organization with an owner (imports need admin), a project
    and jobs completed, running and failed. Streams end within a second, so that a fuzzer's
    GET of one does not hang."""
    org = stack.org()
    owner = stack.user(org, role="owner")
    unlimited = "100000 per minute"
    app = stack.make_app(EVENTS_MAX_SECONDS=1, EVENTS_POLL_SECONDS=0.2, API_RATE_LIMIT=unlimited,
                         POLL_RATE_LIMIT=unlimited, SUBMIT_RATE_LIMIT=unlimited,
                         ORG_SUBMIT_RATE_LIMIT=unlimited)
    with served(app) as url:
        requests.post(f"{url}/api/v1/orgs/{org}/projects", json={"name": "Apollo"},
                      headers=owner.auth, timeout=10).raise_for_status()
        for kind, params in (("projects_export", {}), ("bench.sleep", {"seconds": 60}),
                             ("test.fail", {})):
            requests.post(f"{url}/api/v1/orgs/{org}/jobs", json={"kind": kind, "params": params},
                          headers=owner.auth, timeout=10).raise_for_status()
        yield url, org, owner


def test_the_document_is_public_and_covers_every_route_and_error_code(target, stack: Stack):
    url, _, _ = target
    document = requests.get(url + "/api/v1/openapi.json", timeout=10)  # no token
    assert document.status_code == 200
    paths = document.json()["paths"]
    routed = {rule.rule for rule in stack.make_app().url_map.iter_rules()
              if rule.endpoint.startswith("api.")}
    assert {p.replace("{", "<").replace("}", ">") for p in paths} == routed
    listed = set()
    for operations in paths.values():
        for operation in operations.values():
            for status, answer in operation["responses"].items():
                schema = answer.get("content", {}).get("application/json", {}).get("schema", {})
                codes = schema.get("properties", {}).get("error", {}).get("properties", {}).get(
                    "code", {}).get("enum", [])
                assert all(HTTP_STATUS[code] == int(status) for code in codes)
                listed.update(codes)
    assert listed == set(HTTP_STATUS) - {"method_not_allowed"}  # 405: a method not in the document


@pytest.mark.slow
def test_schemathesis_finds_nothing(target):
    url, org, owner = target
    run = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "run", url + "/api/v1/openapi.json",
         "--phases", "examples,coverage,fuzzing,stateful", "--checks", CHECKS,
         "--seed", "20261201", "--max-examples", "30", "--max-time", "90",
         "--header", f"Authorization: Bearer {owner.token}", "--request-timeout", "10",
         "--workers", "1", "--suppress-health-check", "all", "--warnings", "off"],
        env=dict(os.environ, SCHEMATHESIS_HOOKS="tests.contract.hooks",
                 SPACEJOBS_CONTRACT_ORG=str(org), PYTHONPATH=str(ROOT), NO_COLOR="1"),
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    report = ROOT / ".pytest_cache" / "schemathesis.txt"
    report.parent.mkdir(exist_ok=True)
    report.write_text(run.stdout + run.stderr)  # the whole run, for a reader of a green one too
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
