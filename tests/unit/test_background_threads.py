"""The threads that reach the database in the background, against a server that is not there:
the one that hears finished jobs (models/jobs/waiting.py) and the counters' flush
(models/ops/counters.py). Each warns once per outage (not at every retry); the listener wakes
its waiters so they re-read their rows, and stops when closed; the counters keep their counts."""

from __future__ import annotations

import logging
import uuid

from spacejobs.models.jobs import waiting

NOWHERE = "postgresql://nobody@127.0.0.1:9/nowhere?connect_timeout=1"


def test_an_unreachable_database_is_one_warning_and_waiters_are_woken(caplog):
    with caplog.at_level(logging.WARNING, logger="spacejobs.waiting"):
        listener = waiting.FinishListener(NOWHERE)
        waiter = listener.register(uuid.uuid4())
        assert waiter.wait(5)  # woken to re-read its row, since nothing is heard
        assert not listener.ready(0)
        waiter.clear()
        assert waiter.wait(5)  # and again after the next failed try
        listener.close()
    warnings = [r for r in caplog.records if "listening for finished jobs failed" in r.getMessage()]
    assert len(warnings) == 1


def test_a_closed_listener_has_stopped_its_thread():
    listener = waiting.FinishListener(NOWHERE)
    listener.close()
    assert not listener._thread.is_alive()


def test_without_a_url_to_listen_on_nobody_is_ever_announced():
    unheard = waiting.listener(None)
    assert not unheard.ready(0.01)
    assert not unheard.register(uuid.uuid4()).is_set()
    unheard.close()


def test_counters_that_cannot_be_flushed_warn_once_and_keep_their_counts(caplog):
    from sqlalchemy import create_engine

    from spacejobs.models.ops.counters import BufferedCounters

    nowhere = create_engine("postgresql+psycopg://nobody@127.0.0.1:9/nowhere?connect_timeout=1")
    counters = BufferedCounters(lambda: nowhere, interval=3600)
    with caplog.at_level(logging.WARNING, logger="spacejobs.counters"):
        for _ in range(3):
            counters.add("spacejobs_wakeups_published_total")
            counters.flush()
    warned = [r for r in caplog.records if "not flushed" in r.getMessage()]
    assert len(warned) == 1
    assert counters._pending["spacejobs_wakeups_published_total"] == 3
