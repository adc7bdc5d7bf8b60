"""A smoke run of ``python -m bench.no_redis`` on the session's PostgreSQL and a Redis of its
own, with tiny sizes: both phases measured (Redis running, then stopped), every job completed
once in each, the figures printed. No timing or ratio is judged here: that is the benchmark's
report, and on a shared machine a tiny run's figures mean nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.kit.processes import REPO_ROOT
from tests.kit.servers import Servers


def test_quick_run_measures_both_phases_and_every_job_ran_once(servers: Servers) -> None:
    env = dict(os.environ, DATABASE_URL=servers.admin_url, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-m", "bench.no_redis", "--quick", "--jobs", "60",
                           "--latency-jobs", "10"], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    for redis in ("running", "stopped"):
        assert re.search(rf"^Redis {redis} *: drain 60 jobs in [\d.]+ s, [\d,]+ jobs/s; latency"
                         r" submit > finish p50 [\d.]+ ms", done.stdout, re.MULTILINE), output[-4000:]
        for part, count in (("drain", 60), ("latency", 10)):
            assert re.search(rf"^ok {part}, Redis {redis}: {count}/{count} completed", done.stdout,
                             re.MULTILINE), output[-4000:]
    assert "FAIL" not in done.stdout
