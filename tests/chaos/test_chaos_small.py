"""A small chaos run (bench/chaos.py): one worker SIGKILLed, Redis and PostgreSQL restarted under
running workers, a few cancels, and still every accepted job ends exactly once.

It starts its own private PostgreSQL and Redis whatever DATABASE_URL / REDIS_URL say, because
it restarts them; the session's servers (tests/conftest.py) are not used.
"""

from __future__ import annotations

import pytest

from bench.chaos import run_chaos


@pytest.mark.slow
def test_small_chaos_run_loses_nothing_and_finishes_nothing_twice() -> None:
    report = run_chaos(
        jobs=300,
        workers=3,
        concurrency=2,
        max_kills=1,
        kill_every=2.0,
        cancel_fraction=0.05,
        max_sleep=0.2,
        outage=2.0,
        # Slow enough that both restarts fall well inside the submissions, fast enough for ~1 min.
        rate=10,
        seed=7,
        timeout=120,
    )
    print(report.render())  # shown by pytest on failure, and with -s

    assert report.error is None, report.error
    assert (report.kills, report.redis_restarts, report.pg_restarts) == (1, 1, 1)
    assert report.accepted > 0
    assert report.lost == 0
    assert report.finished_twice == 0
    assert report.still_leased == 0
    assert report.completed + report.cancelled + report.failed == report.accepted
    # Deterministic database facts too: each job's events form one chain ending in its status,
    # and only jobs someone cancelled are cancelled.
    assert report.broken_event_chains == 0 and report.status_disagrees_with_events == 0
    assert report.cancelled_unasked == 0 and report.cancel_answer_contradicted == 0
