"""Programs from Debian that some tests drive (Chromium, pgbouncer): found, or the test skips.

In CI (``CI`` set to anything but ``0``/``false``) a missing program fails the test instead, so
a green CI run always includes it; ``.ci/run`` installs both with apt-get.
"""

from __future__ import annotations

import os
import shutil

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def find_program(name: str, *, needed_by: str) -> str:
    """The path of ``name`` (on PATH, or in the sbin directories root's PATH has); skips the
    test when it is missing, or fails it in CI."""
    found = shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/sbin:/usr/local/sbin")
    if found:
        return found
    reason = f"{name} not found (Debian: apt-get install -y {name}); {needed_by} need it"
    if in_ci():
        pytest.fail(reason + " and CI must run them", pytrace=False)
    pytest.skip(reason)
