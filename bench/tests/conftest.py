"""The benchmarks' own tests: their logic without servers (the harness, the chaos run's
verdicts), and smoke runs of each benchmark's command line, tiny, on the session's servers.

A smoke run starts the benchmark as a person would (``python -m bench.x …``, a subprocess) and
reads what it printed: that every figure was measured and every verdict printed, never a timing.
Like the benchmarks, these stand on the test kit (tests/kit/); nothing under tests/ imports
bench/ (tests/unit/test_one_way.py). `pytest` runs them with the rest (pyproject.toml's
``testpaths``); `pytest bench/tests` runs them alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kit.servers import Servers, find_or_start


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    """``DATABASE_URL``/``REDIS_URL`` when set, else embedded ones for the session. The
    benchmarks make their own databases from the admin URL (none needs the tests' template)."""
    found = find_or_start()
    try:
        yield found
    finally:
        found.close()
