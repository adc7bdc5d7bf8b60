"""A smoke run of the waiting benchmark (``python -m bench.waiting``) on the session's
PostgreSQL and a Redis of its own: the command line a person would type, with tiny sizes, must
measure every figure, stop and restart its Redis, and print one line per target. Nothing here
looks at a timing or a verdict: on a shared machine they mean nothing, and PASS / FALL SHORT is
the benchmark's to give.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.kit.processes import REPO_ROOT
from tests.kit.servers import Servers

pytestmark = pytest.mark.slow  # a benchmark's smoke run

TINY = ["--quick", "--jobs", "100", "--samples", "1", "--cpu-seconds", "1", "--timers", "10",
        "--spread", "2", "--lead", "2", "--patience", "2", "--children", "50",
        "--max-parallel", "10", "--steps", "5", "--group-seconds", "1", "--burst", "50",
        "--running-for", "0.5", "--sweep-interval", "0.5"]
VERDICT = r"(PASS|FALL SHORT)$"
TIMER = (r"^issue 16 timers: 10 ({when}), Redis {redis}, fire <= 1 s late at p95"
         r" \(SPACEJOBS_TIMER_INTERVAL=0.25 s, SPACEJOBS_SWEEP_INTERVAL=0.5 s\):"
         r" (completion p95 [\d.]+ s|\d+ of 10 not completed)"
         r" .*" + VERDICT)


def test_quick_run_measures_every_figure_and_prints_the_targets(servers: Servers) -> None:
    env = dict(os.environ, DATABASE_URL=servers.admin_url, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-m", "bench.waiting", *TINY], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "FAILED" not in output, output[-6000:]
    report = done.stdout

    def line(pattern: str) -> None:
        assert re.search(pattern, report, re.MULTILINE), f"{pattern}\n{report[-6000:]}"

    line(r"SPACEJOBS_SWEEP_INTERVAL=0.5 s \(the product's default is [\d.]+ s\),"
         r" SPACEJOBS_TIMER_INTERVAL=0.25 s \(the product's default\)")
    line(r"^issue 16 slots: 100 jobs waiting \(50 on timers, 50 on signals\) hold 0 leases: at most"
         r" \d+ in \d+ readings, \d+ still waiting at the end " + VERDICT)
    line(r"^issue 16 slots: the workers' CPU with 100 jobs waiting is within noise of idle .*:"
         r" [\d.]+% of a core .* allowed [\d.]+% " + VERDICT)
    line(r"^issue 16 fan-out: 50 children, max_parallel 10, drain >= 0.8x a plain drain of 50"
         r" bench.noop: [\d.]+x \([\d,]+ vs [\d,]+ jobs/s.*\) " + VERDICT)
    for redis in ("running", "stopped"):
        for when in ("due in the same second", "spread over 2 s"):
            line(TIMER.format(when=when, redis=redis))
    line(r"^issue 16 chain: 5 steps of bench.noop, <= 5 ms per step beyond the steps' own work:"
         r" [\d.]+ ms per step \(median of 1; each .*\) " + VERDICT)
    line(r"^issue 31 group: two 1 s bench.sleep steps take <= 1.5 s from the submit to the"
         r" completion on 2 free slots \(1 worker\(s\) -c 2\) after a burst of 50 bench.noop:"
         r" [\d.]+ s \(median of 1; each [\d.]+ s \(the steps [\d.]+ s, \d+ given back\)\) "
         + VERDICT)
    line(r"^issue 31 cancel: a workflow's cancel reaches its running grandchild \(a 60 s"
         r" bench.sleep under a bench_waiting.fan step\) within 1 s: [\d.-]+ s \(median of 1;"
         r" each [\d.-]+ s after 0.5 s of its run\) " + VERDICT)
