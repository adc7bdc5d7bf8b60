"""The flow control page's example (docs/examples/partner_sync.py), run as a reader would run
it: the kind loaded by a real worker, the script in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from itertools import pairwise

from sqlalchemy import text

from tests.kit.processes import REPO_ROOT
from tests.kit.stack import Stack

EXAMPLES = REPO_ROOT / "docs" / "examples"


def test_the_partner_sync_example_limits_orders_and_debounces(bare_stack: Stack):
    stack = bare_stack
    env = {"PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(EXAMPLES)]),
           "SPACEJOBS_EXTRA_KIND_MODULES": "partner_sync"}
    stack.start_worker(concurrency=2, **env)
    org = stack.org()
    anna = stack.user(org, role="owner")
    done = subprocess.run([sys.executable, str(EXAMPLES / "partner_sync.py"), str(org),
                           str(anna.id)], cwd=REPO_ROOT, env=stack.env(**env),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "debounced True True" in lines
    ended = [line.split() for line in lines if line.startswith("ended ")]
    assert [(status, reason) for _, _, status, *reason in ended] == [
        ("completed", ["import", "0"]), ("completed", ["import", "1"]),
        ("completed", ["import", "2"]), ("completed", ["edit", "2"])]
    with stack.admin() as conn:
        rows = conn.execute(text(
            "SELECT j.id::text, j.sequence_key, j.finished_at,"
            " (SELECT min(e.at) FROM job_history e WHERE e.job_id = j.id"
            "  AND e.to_status = 'leased') AS leased"
            " FROM jobs j WHERE j.organization_id = :o ORDER BY j.sequence_position NULLS LAST"),
            {"o": org}).all()
    assert len(rows) == 4  # the second edit made no job of its own
    acme = [row for row in rows if row.sequence_key == "acme"]
    for before, after in pairwise(acme):
        assert before.finished_at <= after.leased
    starts = sorted(row.leased for row in rows)
    assert all(starts[i + 2] - starts[i] >= timedelta(seconds=2) for i in range(len(starts) - 2))
