"""`spacejobs web` keeps its database connections under load: once every request thread has
used one, more requests open no new PostgreSQL backend (each one is a fork and a login on the
server, and its prepared statements start again from nothing)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import requests

from models.db.engine import libpq_url
from tests.kit.stack import Stack

THREADS = 16


def sessions_opened(conn: psycopg.Connection) -> int:
    """Sessions the stack's database has seen opened (a backend reports its own after its first
    transaction; this connection has reported itself before the first call that matters)."""
    row = conn.execute("SELECT sessions FROM pg_stat_database"
                       " WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0])


def test_a_busy_web_process_opens_no_backend_once_warm(bare_stack: Stack):
    web, url = bare_stack.start_web(SPACEJOBS_WEB_THREADS=str(THREADS),
                                    SPACEJOBS_API_RATE_LIMIT="100000 per minute")
    org = bare_stack.org()
    token = bare_stack.user(org).token

    def me(_: int) -> int:
        return requests.get(url + "/api/v1/me", headers={"Authorization": f"Bearer {token}"},
                            timeout=10).status_code

    try:
        with psycopg.connect(libpq_url(bare_stack.admin_url), autocommit=True) as watcher, \
                ThreadPoolExecutor(max_workers=2 * THREADS) as clients:
            watcher.execute("SELECT 1")
            # twice as many clients as threads: every thread busy, every request a transaction
            assert set(clients.map(me, range(20 * THREADS))) == {200}
            time.sleep(0.5)
            before = sessions_opened(watcher)
            assert set(clients.map(me, range(40 * THREADS))) == {200}
            time.sleep(0.5)
            opened = sessions_opened(watcher) - before
    finally:
        bare_stack.retire(web)
    assert opened == 0, f"{opened} new database sessions for {40 * THREADS} requests"
