"""The one deadline loop of the tests: poll until something holds, fail saying what did not."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float = 20, what: str | Callable[[], str] = "condition",
               *, interval: float = 0.1,
               failure: Callable[[str], BaseException] = AssertionError) -> T:
    """Poll ``condition`` every ``interval`` seconds until it gives a true value, and return
    that value. After ``timeout`` seconds raise ``failure`` with a sentence saying ``what`` (a
    callable is asked only then, for facts as they are at the end). ``condition`` may raise to
    give up at once (a process that died will never get ready)."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise failure(f"{said} not reached in {timeout:g} s")
        time.sleep(interval)
    return value
