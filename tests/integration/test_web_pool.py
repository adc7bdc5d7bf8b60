"""`spacejobs web` keeps its database connections under load: however busy, a process opens at
most one backend per request thread and keeps them (each new one is a fork and a login on the
server, and its prepared statements start again from nothing)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import requests

from models.db.engine import libpq_url
from tests.kit.stack import Stack

THREADS = 16
WEB_BACKENDS = ("SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'spacejobs-web'")


class BackendWatch(threading.Thread):
    """Every web backend of the stack's database seen while it runs, looked at every 2 ms: a
    backend opened and closed between two looks lives at least one request, so a web that
    churns its connections shows many more than it ever holds at once."""

    def __init__(self, admin_url: str) -> None:
        super().__init__(daemon=True)
        self.url = libpq_url(admin_url)
        self.seen: set[int] = set()
        self.looks = 0
        self._done = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._done.wait(0.002):
                self.seen.update(pid for (pid,) in conn.execute(WEB_BACKENDS))
                self.looks += 1

    def stop(self) -> set[int]:
        self._done.set()
        self.join(timeout=10)
        return self.seen


def test_a_busy_web_process_never_holds_more_backends_than_threads(bare_stack: Stack):
    web, url = bare_stack.start_web(SPACEJOBS_WEB_THREADS=str(THREADS),
                                    SPACEJOBS_API_RATE_LIMIT="100000 per minute")
    org = bare_stack.org()
    token = bare_stack.user(org).token

    def me(_: int) -> int:
        return requests.get(url + "/api/v1/me", headers={"Authorization": f"Bearer {token}"},
                            timeout=10).status_code

    watch = BackendWatch(bare_stack.admin_url)
    watch.start()
    try:
        # twice as many clients as threads: every thread busy, every request a transaction
        with ThreadPoolExecutor(max_workers=2 * THREADS) as clients:
            assert set(clients.map(me, range(60 * THREADS))) == {200}
    finally:
        seen = watch.stop()
        bare_stack.retire(web)
    assert watch.looks > 10, "the watch never looked"
    assert 0 < len(seen) <= THREADS, f"{len(seen)} web backends for {THREADS} threads"
