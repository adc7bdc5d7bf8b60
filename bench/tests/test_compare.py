"""A smoke run of ``python -m bench.compare`` on the session's servers, this checkout against
itself: the cycle figure (the claim's and the finish's statements, no worker) measures on both
sides and prints each side's median. The leases figure's own path runs alone, small. Nothing
here looks at a timing."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.kit.processes import REPO_ROOT
from tests.kit.servers import Servers


def test_the_cycle_figure_measures_both_checkouts_and_prints_their_medians(servers: Servers) -> None:
    env = dict(os.environ, DATABASE_URL=servers.admin_url, REDIS_URL=servers.redis_url,
               PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "bench.compare", "--before", str(REPO_ROOT), "--figure", "cycle",
         "--rounds", "1", "--each", "1"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert len(re.findall(r"^\s+[\d,]+ jobs/s \(10000 jobs in [\d.]+ s, store\.claim_batch and"
                          r" store\.complete_batch of 50", output, re.MULTILINE)) == 2, output[-4000:]
    for side in ("before", "after"):
        assert re.search(rf"^  {side}: [\d,.]+ \(range ", output, re.MULTILINE), output[-4000:]


LEASES = """
import os, sys
sys.path.insert(0, os.getcwd())
from bench.peers import load_peer
peer = load_peer("spacejobs").prepare(os.environ["DATABASE_URL"], os.environ["REDIS_URL"], "leases")
try:
    print(peer.cycle_rate(300, 100, leases=True))
finally:
    peer.cleanup()
"""


def test_the_leases_figure_times_each_statement_of_a_batch(servers: Servers) -> None:
    """The `leases` figure's own path: the heartbeat's and the standing's statements between
    the claim and the finish, every lease answered (it raises otherwise), and each statement's
    time a job printed."""
    env = dict(os.environ, DATABASE_URL=servers.admin_url, REDIS_URL=servers.redis_url,
               PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-c", LEASES], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert re.search(r"^[\d,]+ jobs/s \(300 jobs in [\d.]+ s, store\.claim_batch, extend_leases and"
                     r" lease_standing \(one transaction\) and store\.complete_batch of 100, .*µs a"
                     r" job: claim [\d.]+, heartbeat [\d.]+, standing [\d.]+, finish [\d.]+;",
                     done.stdout, re.MULTILINE), output[-4000:]
