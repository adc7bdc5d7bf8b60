"""`spacejobs web` keeps its database connections under load: however busy, a process opens at
most one backend per request thread and keeps them (each new one is a fork and a login on the
server, and its prepared statements start again from nothing)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import requests

from tests.kit.sampling import QuerySampler
from tests.kit.stack import Stack

THREADS = 16
WEB_BACKENDS = ("SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'spacejobs-web'")


def test_a_busy_web_process_never_holds_more_backends_than_threads(bare_stack: Stack):
    web, url = bare_stack.start_web(SPACEJOBS_WEB_THREADS=str(THREADS),
                                    SPACEJOBS_API_RATE_LIMIT="100000 per minute")
    org = bare_stack.org()
    token = bare_stack.user(org).token

    def me(_: int) -> int:
        return requests.get(url + "/api/v1/me", headers={"Authorization": f"Bearer {token}"},
                            timeout=10).status_code

    # Every web backend seen, looked for every 2 ms: a backend opened and closed between two
    # looks lives at least one request, so a web that churns its connections shows many more
    # than it ever holds at once.
    seen: set[int] = set()
    watch = QuerySampler(bare_stack.admin_url, WEB_BACKENDS,
                         lambda rows: seen.update(pid for (pid,) in rows), interval=0.002)
    watch.start()
    try:
        # twice as many clients as threads: every thread busy, every request a transaction
        with ThreadPoolExecutor(max_workers=2 * THREADS) as clients:
            assert set(clients.map(me, range(60 * THREADS))) == {200}
    finally:
        watch.stop()
        bare_stack.retire(web)
    assert watch.samples > 10, "the watch never looked"
    assert 0 < len(seen) <= THREADS, f"{len(seen)} web backends for {THREADS} threads"
