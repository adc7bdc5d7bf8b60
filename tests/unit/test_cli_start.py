"""Every ``spacejobs`` command imports its CLI module, ``spacejobs.webapp.cli``, and with it the
``spacejobs.webapp`` package. Most commands (``db upgrade``, the people and organizations ones,
``worker``) never build the web app, so the package loads ``create_app`` and what it needs
(Flask, the limiter, the pages) only when something asks for it: a third less CPU a command."""

from __future__ import annotations

import subprocess
import sys

from tests.kit.processes import REPO_ROOT

LOADED = """
import sys
import spacejobs.webapp.cli
print(sorted(name for name in ("flask", "flask_limiter", "spacejobs.webapp.app", "spacejobs.webapp.ui")
             if name in sys.modules))
from spacejobs.webapp import create_app
print(create_app.__module__, "flask" in sys.modules)
"""


def test_the_cli_imports_no_flask_until_the_app_is_asked_for() -> None:
    done = subprocess.run([sys.executable, "-c", LOADED], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    before, after = done.stdout.splitlines()
    assert before == "[]"
    assert after == "spacejobs.webapp.app True"
