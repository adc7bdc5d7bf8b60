"""Smoke runs of the two cost benchmarks, tiny, on the session's servers: each prints its
figures. ``bench.submit_cost`` queues more than one organization's default quota over its
rounds (it went unrun and broke on that once); ``bench.claim_commit`` times both kinds of
claim commit. The figures are not judged here: a tiny run on a shared machine means nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.kit.processes import REPO_ROOT
from tests.kit.servers import Servers

MS = r"[\d.]+ \(min [\d.]+, max [\d.]+\)"


def run(servers: Servers, *args: str) -> str:
    env = dict(os.environ, DATABASE_URL=servers.admin_url, REDIS_URL=servers.redis_url,
               PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-m", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    return done.stdout


def test_submit_cost_runs_past_one_organizations_quota(servers: Servers) -> None:
    out = run(servers, "bench.submit_cost", "--jobs", "600", "--rounds", "2")
    assert re.search(rf"this checkout: submit, one per transaction {MS}; submit_many, 100 per "
                     rf"transaction {MS}; submit_job\(\) looped in the database {MS}$", out,
                     re.MULTILINE), out


def test_claim_commit_times_both_commits(servers: Servers) -> None:
    out = run(servers, "bench.claim_commit", "--claims", "200")
    for way in ("durable      ", "no flush wait"):
        assert re.search(rf"^claim-only transaction, {way}: p50 [\d.]+ ms, p95 [\d.]+ ms "
                         rf"\(100 claims\)$", out, re.MULTILINE), out
