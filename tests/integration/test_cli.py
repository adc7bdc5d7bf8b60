"""The operators' command line, run as a real process against a real database: creating
commands print the new id or token alone on stdout, and bad input is a clear one-line error."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from sqlalchemy import text

from tests.kit.processes import REPO_ROOT
from tests.kit.stack import Stack


def spacejobs(stack: Stack, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spacejobs.webapp.cli", *args], cwd=REPO_ROOT,
                          env=stack.env(), input=stdin, capture_output=True, text=True, timeout=60)


def test_help_lists_every_command(bare_stack: Stack):
    answer = spacejobs(bare_stack, "--help")
    assert answer.returncode == 0
    for command in ("db", "users", "orgs", "tokens", "web", "worker", "beat", "demo"):
        assert f"  {command} " in answer.stdout


def test_creating_commands_print_only_what_they_created(bare_stack: Stack):
    email = f"cli-{uuid.uuid4().hex[:8]}@example.test"
    org_name = f"cli-org-{uuid.uuid4().hex[:6]}"
    user_id = spacejobs(bare_stack, "users", "create", email, "--name", "Cli").stdout.strip()
    org_id = spacejobs(bare_stack, "orgs", "create", org_name).stdout.strip()
    assert uuid.UUID(user_id) and uuid.UUID(org_id)
    added = spacejobs(bare_stack, "orgs", "add-member", org_name, email, "--role", "admin")
    assert (added.returncode, added.stdout) == (0, "")
    token = spacejobs(bare_stack, "tokens", "create", email).stdout.strip()
    assert token.startswith("sj_") and "\n" not in token
    client = bare_stack.make_app().test_client()
    me = client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}).get_json()
    assert me["user"]["id"] == user_id
    assert me["memberships"] == [{"organization_id": org_id, "organization_name": org_name,
                                  "organization_state": "active", "role": "admin"}]
    assert spacejobs(bare_stack, "orgs", "set-weight", org_name, "3").returncode == 0
    with bare_stack.admin() as conn:
        assert conn.execute(text("SELECT claim_weight FROM organizations WHERE id = :o"),
                            {"o": org_id}).scalar_one() == 3
    assert spacejobs(bare_stack, "orgs", "set-weight", org_name, "0").stderr.strip() == (
        "Error: The weight must be a whole number from 1 to 100.")
    assert spacejobs(bare_stack, "orgs", "set-state", org_id, "read_only").returncode == 0
    assert spacejobs(bare_stack, "orgs", "remove-member", org_id, email).returncode == 0
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}
                      ).get_json()["memberships"] == []


@pytest.mark.parametrize("args, message", [
    (("users", "create", "no-at-sign"), "An email address needs an @."),
    (("orgs", "add-member", "no-such-org", "nobody@example.test"),
     "No single organization matches that id or name."),
    (("tokens", "create", "nobody@example.test"), "No user with that email."),
])
def test_bad_input_is_a_one_line_error_and_changes_nothing(bare_stack: Stack, args, message):
    answer = spacejobs(bare_stack, *args)
    assert answer.returncode != 0 and answer.stdout == ""
    assert answer.stderr.strip() == f"Error: {message}"


def test_db_upgrade_is_idempotent(bare_stack: Stack):
    for _ in range(2):
        answer = spacejobs(bare_stack, "db", "upgrade")
        assert answer.returncode == 0, answer.stderr


def test_set_rate_limit_says_what_it_set(bare_stack: Stack):
    org_name = f"cli-rate-{uuid.uuid4().hex[:6]}"
    org_id = spacejobs(bare_stack, "orgs", "create", org_name).stdout.strip()
    answer = spacejobs(bare_stack, "orgs", "set-rate-limit", org_name, "bench.noop", "10 per minute")
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip() == (f"bench.noop in {org_name} ({org_id}): at most 10 start(s) per "
                                     "60 s; jobs beyond it stay queued, in order.")
    removed = spacejobs(bare_stack, "orgs", "set-rate-limit", org_id, "bench.noop", "default")
    assert removed.stdout.strip() == (f"bench.noop in {org_id}: no rate limit of the operators' "
                                      "any more (the kind's own applies, if it declares one).")


def test_without_database_url_a_command_points_to_the_demos_servers_file(bare_stack: Stack, tmp_path):
    env = {k: v for k, v in bare_stack.env().items() if k != "DATABASE_URL"}

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "spacejobs.webapp.cli", "orgs", "set-rate-limit",
                               "Acme Rockets", "bench.noop", "1 per minute"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)

    alone = run()
    assert alone.returncode == 1 and alone.stdout == ""
    assert "DATABASE_URL is not set" in alone.stderr
    assert "set -a; . .spacejobs/servers.env; set +a" in alone.stderr
    (tmp_path / ".spacejobs").mkdir()
    (tmp_path / ".spacejobs" / "servers.env").write_text("DATABASE_URL=postgresql://nowhere/x\n")
    beside_a_demo = run()
    assert "A running `spacejobs demo` wrote its servers to .spacejobs/servers.env" in beside_a_demo.stderr
