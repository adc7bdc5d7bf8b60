"""A TCP proxy in front of PostgreSQL that a test can cut and restore: a network partition
between one worker and the database, while everything else keeps its direct connection."""

from __future__ import annotations

import contextlib
import socket
import threading

from sqlalchemy.engine import make_url


def postgres_address(database_url: str) -> tuple[str, int] | str:
    """Where a database URL's server listens: (host, port), or the embedded server's socket."""
    url = make_url(database_url)
    if url.query.get("host"):  # embedded server: a unix socket directory
        return f"{url.query['host']}/.s.PGSQL.{url.port or 5432}"
    return (url.host or "127.0.0.1", url.port or 5432)


def through(database_url: str, partition: Partition) -> str:
    """The same role and database, reached through ``partition``."""
    url = make_url(database_url)
    return url.set(host=partition.bind, port=partition.port, query={}).render_as_string(hide_password=False)


class Partition:
    def __init__(self, target: tuple[str, int] | str, bind: str = "127.0.0.1") -> None:
        self.target = target  # (host, port) or a unix socket path
        self.bind = bind  # the address it listens on
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self.port = 0
        self.open()

    def open(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.bind, self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def open_again(self) -> None:
        """Heal the partition (on the same port)."""
        self.open()

    def cut(self) -> None:
        """Drop every proxied connection and refuse new ones."""
        if self._listener is not None:
            # close() alone does not wake a thread blocked in accept(): it would keep accepting.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self._conns.clear()

    def _connect_target(self) -> socket.socket:
        if isinstance(self.target, str):
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        upstream.connect(self.target)
        return upstream

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = self._connect_target()
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
