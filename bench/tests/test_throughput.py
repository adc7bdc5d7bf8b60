"""A smoke run of the benchmark (``python -m bench.throughput``) on the session's servers: the
command line a person would type, with tiny sizes, must measure every figure, read every
system's records and print the targets. Nothing here looks at a timing: on a shared machine
they mean nothing, and the verdicts (PASS / FALL SHORT) are the benchmark's to give.

PgQueuer and Procrastinate join when their packages are installed (the ``bench`` extra); the
test suite's own install (``.[test]``) has Space Jobs and plain Celery only.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from tests.kit.processes import REPO_ROOT
from tests.kit.programs import find_program
from tests.kit.servers import Servers

pytestmark = pytest.mark.slow  # a benchmark's smoke run

TINY = ["--quick", "--jobs", "100", "--bulk", "1000", "--latency-seconds", "1", "--web-seconds", "1",
        "--web-connections", "8", "--flood", "3000", "--wait-jobs", "5"]
OPTIONAL_PEERS = {"pgqueuer": "pgqueuer", "procrastinate": "procrastinate"}  # peer -> its package


def test_quick_run_measures_every_system_and_prints_the_targets(servers: Servers) -> None:
    find_program("wrk", needed_by="the benchmark's web figure")
    peers = ["spacejobs", "celery"] + [peer for peer, package in OPTIONAL_PEERS.items()
                                       if importlib.util.find_spec(package) is not None]
    env = dict(os.environ, DATABASE_URL=servers.admin_url, REDIS_URL=servers.redis_url,
               PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "bench.throughput", *TINY, *(arg for p in peers for arg in ("--peer", p))],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "FAILED" not in output, output[-6000:]
    assert re.search(r"^target 1b drain ≥ 5\S plain Celery [^:]+: [\d.]+\S \(.* jobs/s\) (PASS|FALL SHORT)$",
                     output, re.MULTILINE), output[-6000:]
    assert re.search(r"^target 3a latency p50 .*(PASS|FALL SHORT)$", output, re.MULTILINE), output[-6000:]
    assert re.search(r"^target 2c web POST .*: [\d,]+ jobs/s (PASS|FALL SHORT)$", output, re.MULTILINE)
    assert re.search(r"^issue 11 a lone job behind a flood .*: [\d,.]+ ms at [\d,]+ jobs/s"
                     r" (PASS|FALL SHORT)$",
                     output, re.MULTILINE), output[-6000:]
    assert re.search(r"^issue 11 service.wait .*: p50 [\d.]+ / p95 [\d.]+ ms (PASS|FALL SHORT)$",
                     output, re.MULTILINE), output[-6000:]
    if "pgqueuer" in peers:
        assert re.search(r"^target 1a drain .*(PASS|FALL SHORT)$", output, re.MULTILINE), output[-6000:]
        assert re.search(r"^target 18c enqueue .* ≥ 0.8\S PgQueuer [^:]+: [\d.]+\S \(.* jobs/s\)"
                         r" (PASS|FALL SHORT)$", output, re.MULTILINE), output[-6000:]
        assert re.search(r"^target 18d bulk .* ≥ 0.5\S PgQueuer [^:]+: [\d.]+\S \(.* jobs/s\)"
                         r" (PASS|FALL SHORT)$", output, re.MULTILINE), output[-6000:]
    else:  # issue 18's own targets are against PgQueuer: the run says what it could not compare
        assert re.search(r"^target 18c enqueue .*: not measured \(PgQueuer enqueue\)$", output,
                         re.MULTILINE), output[-6000:]
