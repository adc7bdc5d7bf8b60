"""Browser tests: Playwright (pytest-playwright) driving Debian's Chromium against the app served
on a real port, with real worker processes behind it.

They skip, saying why, only when Chromium cannot be found on a developer's machine; in CI (``CI``
set to anything but ``0``/``false``) a missing browser fails them instead, so a green CI run
always includes them. ``.ci/run`` installs Chromium with apt-get when it is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spacejobs.demo.seed import seed
from tests.conftest import served
from tests.kit.programs import find_program
from tests.kit.stack import Stack

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def find_chromium() -> str:
    return find_program("chromium", needed_by="the browser tests")


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    """Debian's Chromium, headless, with nothing that would reach for the (closed) network."""
    return {**browser_type_launch_args, "executable_path": find_chromium(), "headless": True,
            "args": CHROMIUM_ARGS}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args: dict[str, Any]) -> dict[str, Any]:
    return {**browser_context_args, "viewport": {"width": 1180, "height": 760}, "accept_downloads": True}


@dataclass
class Live:
    url: str
    app: Any
    demo: dict[str, dict[str, str]]  # demo users by email: password, org_id, role


@pytest.fixture(scope="module")
def live(stack: Stack) -> Iterator[Live]:
    """The app on a real port (werkzeug, threaded: the events stream holds a thread while the
    page fetches), the demo data seeded as `spacejobs demo` seeds it."""
    with stack.admin() as conn:
        demo = {user["email"]: user for user in seed(conn)}
    app = stack.make_app(EVENTS_POLL_SECONDS=0.2, LOGIN_RATE_LIMIT_ACCOUNT="3 per minute")
    with served(app) as url:
        yield Live(url, app, demo)


@pytest.fixture(scope="session")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Screenshots of each state, kept as test artifacts under pytest's tmp dir."""
    return tmp_path_factory.mktemp("screenshots")
