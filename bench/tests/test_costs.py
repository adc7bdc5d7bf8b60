"""Smoke runs of the cost benchmarks, tiny, on the session's servers: each prints its figures.
``bench.submit_cost`` queues more than one organization's default quota over its rounds (it
went unrun and broke on that once); ``bench.claim_commit`` times both kinds of claim commit;
``bench.path_cost`` times each step of one job's path (and stops if a job is not completed
alone); ``bench.web_ceiling`` drives each of its URLs through a real `spacejobs web` with wrk;
``bench.request_cost`` answers each of its URLs in process and profiles the submit.
The figures are not judged here: a tiny run on a shared machine means nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kit.processes import REPO_ROOT
from tests.kit.programs import find_program
from tests.kit.servers import Servers

pytestmark = pytest.mark.slow  # a benchmark's smoke run

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
                     rf"transaction {MS}; submit_jobs\(\) of one looped in the database {MS}$", out,
                     re.MULTILINE), out


def test_claim_commit_times_both_commits(servers: Servers) -> None:
    out = run(servers, "bench.claim_commit", "--claims", "200")
    for way in ("durable      ", "no flush wait"):
        assert re.search(rf"^claim-only transaction, {way}: p50 [\d.]+ ms, p95 [\d.]+ ms "
                         rf"\(100 claims\)$", out, re.MULTILINE), out


def test_path_cost_times_each_step_of_one_jobs_path(servers: Servers) -> None:
    out = run(servers, "bench.path_cost", "--jobs", "20")
    assert out.startswith("20 jobs, one at a time, one process, no worker:\n"), out
    for step in ("submit (jobs.enqueue)", "claim-only transaction", "finish folded into a claim"):
        assert re.search(rf"^{re.escape(step)} +wall p50 [\d.]+ / p95 [\d.]+ ms; this process's "
                         rf"CPU p50 [\d.]+ / p95 [\d.]+ ms$", out, re.MULTILINE), out


def test_submit_parts_times_each_variant(servers: Servers) -> None:
    find_program("pgbench", needed_by="bench.submit_parts")
    out = run(servers, "bench.submit_parts", "--seconds", "1", "--rounds", "1")
    for label in ("submit_jobs() of one, as the enqueue runs it", "  without the quota's count",
                  "  without the membership's FOR SHARE", "  without the audit row",
                  "  without the event row", "  without the active count", "  without the NOTIFY",
                  "the job's row alone (INSERT INTO jobs)", "a plain one-row INSERT"):
        assert re.search(rf"^{re.escape(label)} +[\d.]+  \([\d.]+\)$", out, re.MULTILINE), out


def test_web_ceiling_answers_each_url_as_it_should(servers: Servers, tmp_path: Path) -> None:
    find_program("wrk", needed_by="bench.web_ceiling")
    out = run(servers, "bench.web_ceiling", "--seconds", "1", "--connections", "4",
              "--profile", str(tmp_path))
    answered = (r"requests/s  \(([\d,]+) answered, ([\d,]+) not 2xx, socket errors none;"
                r" [\d,]+ database sessions opened\)$")
    lines = {label: re.search(rf"^{re.escape(label)} +[\d,]+ {answered}", out, re.MULTILINE)
             for label in ("a URL that does not exist (404)", "GET /api/v1/me", "GET …/projects",
                           "POST …/jobs")}
    assert all(lines.values()), out
    for label, found in lines.items():
        assert found is not None and found[1] != "0", out
        # the 404 line is all 404s; every other URL answers 2xx only (no limit refused it)
        assert (found[2] == found[1]) if "404" in label else found[2] == "0", out
    # --profile: what the web's backends did during the submits (the submit statement among
    # them), and whose CPU it was
    waits = (tmp_path / "waits.txt").read_text()
    assert re.search(r"^ *[\d.]+%  .* \| .* \| -- Every submit, one job or a batch", waits,
                     re.MULTILINE), waits
    cpu = (tmp_path / "cpu.txt").read_text()
    assert re.search(r"^ *[\d.]+%  spacejobs web \(gunicorn\)$", cpu, re.MULTILINE), cpu
    # py-spy's GIL samples where the bench extra is installed, else a line that says why not
    python = (tmp_path / "python.txt").read_text()
    assert re.match(r"\d+ busy samples\n|py-spy is not installed: pip install", python), python


def test_flow_control_benchmark_prints_each_target(servers: Servers) -> None:
    out = run(servers, "bench.flow_control", "--window", "1", "--claimers", "2", "--slots", "2",
              "--fair-seconds", "4", "--finished", "2000", "--rounds", "5", "--keys", "10",
              "--per-key", "4")
    for target in ("19a", "19b", "19c", "19d", "19e", "19f", "19g", "19h"):
        assert re.search(rf"^target {target} .*(PASS|FALL SHORT)$", out, re.M), out
    # the one figure a tiny run can still judge: no window ever holds more than its limit
    assert re.search(r"^target 19a .* PASS$", out, re.M), out


def test_request_cost_prices_each_url_and_profiles_the_submit(servers: Servers) -> None:
    out = run(servers, "bench.request_cost", "--requests", "20", "--top", "15")
    for label in ("a URL that does not exist (404)", "GET /api/v1/me", "POST …/jobs",
                  "GET …/jobs?limit=100"):
        assert re.search(rf"^{re.escape(label)} +CPU +[\d.]+ ms  wall +[\d.]+ ms +[\d,]+ Python "
                         rf"function calls$", out, re.MULTILINE), out
    # the profile names our own submit, without the machine's paths
    assert "POST …/jobs under cProfile, 20 requests" in out, out
    assert re.search(r"webapp/api\.py:\d+\(submit_job\)", out), out
    assert "site-packages" not in out, out
