"""The testing guide's example (docs/guides/testing.md), run as an application runs its own tests:
pytest on docs/examples/testing_example.py, in a process of its own, against a migrated database
(this module's) and with no Redis to reach: spacejobs.testing needs neither a worker nor a broker."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.kit.processes import REPO_ROOT
from tests.kit.stack import Stack

EXAMPLES = REPO_ROOT / "docs" / "examples"


def test_the_guides_example_tests_pass_against_postgresql_alone(bare_stack: Stack) -> None:
    env = bare_stack.env(PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(EXAMPLES)]),
                         REDIS_URL="redis://127.0.0.1:1/0")  # nothing listens there
    ran = subprocess.run(
        # The application's own pytest settings, not this repository's (no xdist, no cache).
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-q",
         str(EXAMPLES / "testing_example.py")],
        capture_output=True, text=True, timeout=180, cwd=REPO_ROOT, env=env)
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    assert "6 passed" in ran.stdout, ran.stdout[-2000:]
