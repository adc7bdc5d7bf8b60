"""The worker's HTTP liveness probe, off by default (``SPACEJOBS_WORKER_HEALTH_PORT``).

``GET /healthz`` answers 200 or 503 with the one line of ``spacejobs worker check``
(models/ops/liveness.py), computed when asked, for the worker's host. It runs in the worker's
main process, on a thread of its own, so it answers while the pool is busy or Celery's consumer
is reconnecting. Any other path is a 404; the answer holds process ids, counts and ages, never
tenant data. It listens on ``SPACEJOBS_WORKER_HEALTH_BIND`` (127.0.0.1 unless set).

One thread, whatever the clients do. The probe used to be a ``ThreadingHTTPServer``: a thread
per connection, with no read timeout, so 300 connections that sent nothing took the main process
from 3 to 303 threads, for good (docs/security.md). Here a single thread waits on every socket
with a selector: a connection costs a descriptor and a small buffer until its request is in,
never a thread. Each must send its whole request head within ``READ_TIMEOUT`` of being accepted
(a total, not per read, so a client trickling a byte at a time is dropped too), and at most
``MAX_WAITING`` connections wait at once: a new one beyond that closes the one that has waited
longest. The oldest rather than the newest, so that idle connections cannot shut the real probe
out (a failing liveness probe restarts the worker, which is what such an attacker wants): a real
probe sends its request as soon as it connects, and is answered before it could be the oldest.
The answer is computed on the same thread, one request at a time: a few milliseconds of queries
(a presence interval more when the check looks twice), meanwhile new connections wait in the
listen backlog.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus

from sqlalchemy import Engine

from spacejobs.models.ops import liveness
from spacejobs.models.settings import Settings

log = logging.getLogger("spacejobs.health")

#: seconds from its accept within which a connection must have sent its whole request head
READ_TIMEOUT = 5.0
#: connections waiting for their request at once; one more closes the one waiting longest
MAX_WAITING = 64
#: the longest request head read (a probe's is ~100 bytes); a longer one is dropped
MAX_HEAD = 8192
#: seconds the answer (under 300 bytes, which fit any socket buffer) may take to send
WRITE_TIMEOUT = 2.0
#: the listen backlog: where connections wait while an answer is being computed
BACKLOG = 128


@dataclass
class _Waiting:
    deadline: float
    head: bytearray = field(default_factory=bytearray)


class Probe:
    """``GET /healthz`` on ``(host, port)``: ``check()`` gives its status and line."""

    def __init__(self, check: Callable[[], tuple[int, str]], host: str, port: int, *,
                 read_timeout: float = READ_TIMEOUT, max_waiting: int = MAX_WAITING) -> None:
        self.check = check
        self.read_timeout = read_timeout
        self.max_waiting = max_waiting
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.create_server((host, port), family=family, backlog=BACKLOG)
        self.listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.listener, selectors.EVENT_READ)
        # In the order they were accepted, which is also the order of their deadlines.
        self._waiting: dict[socket.socket, _Waiting] = {}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="health-probe", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.listener.getsockname()[:2]
        return host, port

    def start(self) -> Probe:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving (within a second) and close every socket."""
        self._stopping.set()
        self._thread.join()
        for connection in list(self._waiting):
            self._drop(connection)
        self._selector.close()
        self.listener.close()

    # -- the one thread -------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                for key, _ in self._selector.select(self._until_next_deadline()):
                    if key.fileobj is self.listener:
                        self._accept()
                    else:
                        self._read(key.fileobj)  # type: ignore[arg-type]
                self._drop_expired()
            except Exception:
                log.exception("liveness probe: unexpected error")
                self._stopping.wait(0.1)

    def _until_next_deadline(self) -> float:
        if not self._waiting:
            return 1.0  # only to notice close()
        oldest = next(iter(self._waiting.values()))
        return min(1.0, max(0.0, oldest.deadline - time.monotonic()))

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                # Out of descriptors, say: try again shortly rather than spin on a readable listener.
                log.warning("liveness probe: cannot accept a connection")
                self._stopping.wait(0.1)
                return
            if len(self._waiting) >= self.max_waiting:
                self._drop(next(iter(self._waiting)))
            connection.setblocking(False)
            self._waiting[connection] = _Waiting(time.monotonic() + self.read_timeout)
            self._selector.register(connection, selectors.EVENT_READ)

    def _read(self, connection: socket.socket) -> None:
        waiting = self._waiting.get(connection)
        if waiting is None:
            return  # closed since the select, to make room for a newer one
        try:
            data = connection.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        waiting.head += data
        if not data or len(waiting.head) > MAX_HEAD:
            self._drop(connection)
        elif b"\r\n\r\n" in waiting.head or b"\n\n" in waiting.head:
            self._forget(connection)
            self._answer(connection, bytes(waiting.head))

    def _answer(self, connection: socket.socket, head: bytes) -> None:
        status, line = self._respond(head.split(b"\n", 1)[0].decode("latin-1").split())
        body = (line + "\n").encode()
        answer = (f"HTTP/1.0 {status} {HTTPStatus(status).phrase}\r\n"
                  f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
                  f"Connection: close\r\n\r\n").encode() + body
        try:
            connection.settimeout(WRITE_TIMEOUT)
            connection.sendall(answer)
        except OSError:
            pass  # the client went away: nothing to tell it
        finally:
            self._close(connection)

    def _respond(self, request_line: list[str]) -> tuple[int, str]:
        if len(request_line) != 3 or not request_line[2].startswith("HTTP/"):
            return 400, "bad request"
        method, path, _ = request_line
        if method != "GET":
            return 405, "only GET"
        if path != "/healthz":
            return 404, "not found"
        return self.check()

    def _drop_expired(self) -> None:
        now = time.monotonic()
        while self._waiting:
            connection, waiting = next(iter(self._waiting.items()))
            if waiting.deadline > now:
                return
            self._drop(connection)

    def _drop(self, connection: socket.socket) -> None:
        self._forget(connection)
        self._close(connection)

    def _forget(self, connection: socket.socket) -> None:
        del self._waiting[connection]
        self._selector.unregister(connection)

    @staticmethod
    def _close(connection: socket.socket) -> None:
        # shutdown() first: a pool process forked while this connection was open holds a copy
        # of its descriptor, and close() alone would leave the connection open in that copy.
        with contextlib.suppress(OSError):
            connection.shutdown(socket.SHUT_RDWR)
        connection.close()


def serve(engine: Engine, settings: Settings) -> Probe:
    """Start the probe on ``settings.worker_health_bind``:``settings.worker_health_port``."""
    hostname = socket.gethostname()

    def check() -> tuple[int, str]:
        try:
            with engine.connect() as conn:
                verdict = liveness.check_host(conn, hostname, settings)
        except Exception:
            log.warning("liveness probe: the database cannot be read")
            return 503, "FAIL: the database cannot be read"
        return (200 if verdict.ok else 503), verdict.summary()

    probe = Probe(check, str(settings.worker_health_bind), settings.worker_health_port).start()
    log.info("liveness probe on %s port %d (GET /healthz)", *probe.address)
    return probe
