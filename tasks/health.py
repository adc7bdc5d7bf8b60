"""The worker's HTTP liveness probe, off by default (``SPACEJOBS_WORKER_HEALTH_PORT``).

``GET /healthz`` answers 200 or 503 with the one line of ``spacejobs worker check``
(models/ops/liveness.py), computed when asked, for the worker's host. It runs in the worker's
main process, on a thread of its own, so it answers while the pool is busy or Celery's consumer
is reconnecting. Any other path is a 404; the answer holds process ids, counts and ages, never
tenant data.
"""

from __future__ import annotations

import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sqlalchemy import Engine

from models.ops import liveness
from models.settings import Settings

log = logging.getLogger("spacejobs.health")


def serve(engine: Engine, settings: Settings) -> ThreadingHTTPServer:
    """Start the probe on ``settings.worker_health_port`` (all interfaces) in a daemon thread."""
    hostname = socket.gethostname()

    def verdict() -> liveness.Verdict | None:
        try:
            with engine.connect() as conn:
                return liveness.check_host(conn, hostname, settings)
        except Exception:
            log.warning("liveness probe: the database cannot be read")
            return None

    class Probe(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/healthz":
                self._answer(404, "not found")
                return
            found = verdict()
            if found is None:
                self._answer(503, "FAIL: the database cannot be read")
            else:
                self._answer(200 if found.ok else 503, found.summary())

        def _answer(self, status: int, line: str) -> None:
            body = (line + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes every few seconds would drown the worker's log

    server = ThreadingHTTPServer(("", settings.worker_health_port), Probe)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="health-probe", daemon=True).start()
    log.info("liveness probe on port %d (GET /healthz)", settings.worker_health_port)
    return server
