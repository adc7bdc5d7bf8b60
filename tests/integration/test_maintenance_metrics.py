"""The metrics chore (tasks/maintenance/metrics.py) against PostgreSQL: the metric events jobs
leave as they move are folded into the counters, and the counters keep their sum."""

from __future__ import annotations

import psycopg
from sqlalchemy import text

from spacejobs.models.db.engine import libpq_url
from spacejobs.tasks.maintenance.metrics import Metrics, MetricsReport
from tests.integration.maintenance_kit import (
    as_beat,
    buffers_read,
    drain_queue,
    new_job,
    report_left_open,
)
from tests.kit.stack import Stack


def pending(stack: Stack) -> int:
    with stack.admin() as conn:
        return conn.execute(text("SELECT count(*) FROM metric_events")).scalar_one()


def finished_total(stack: Stack) -> float:
    """Finished jobs as /metrics counts them: the counters plus the events not folded yet."""
    with stack.admin() as conn:
        return conn.execute(text(
            "SELECT coalesce((SELECT sum(value) FROM metric_counters"
            "                 WHERE name = 'spacejobs_jobs_finished_total'), 0)"
            "     + coalesce((SELECT sum(value) FROM metric_events"
            "                 WHERE name = 'spacejobs_jobs_finished_total'), 0)")).scalar_one()


def test_metric_events_are_folded_into_the_counters(bare_stack: Stack):
    stack = bare_stack
    for _ in range(3):
        new_job(stack)
    drain_queue(stack)
    before, waiting_to_fold = finished_total(stack), pending(stack)
    assert before >= 3 and waiting_to_fold > 0
    report = Metrics(5).run(as_beat(stack))
    assert report == MetricsReport(folded=waiting_to_fold)
    assert pending(stack) == 0 and finished_total(stack) == before
    assert Metrics(5).run(as_beat(stack)) == MetricsReport()


def record_events(stack: Stack, count: int) -> None:
    with stack.admin() as conn:
        conn.execute(text("INSERT INTO metric_events (name, kind, label, value)"
                          " SELECT 'spacejobs_jobs_finished_total', 'bench.noop', 'completed', 1"
                          " FROM generate_series(1, :count)"), {"count": count})


def test_behind_a_held_transaction_a_fold_from_the_last_event_reads_no_folded_events(
        bare_stack: Stack):
    stack = bare_stack
    chore = Metrics(5)
    with report_left_open(stack):
        record_events(stack, 5000)
        assert chore.run(as_beat(stack)).folded >= 5000
        from_first = buffers_read(stack, "SELECT * FROM fold_metric_events(10000, NULL)")
        from_last = buffers_read(stack, "SELECT * FROM fold_metric_events(10000, %s)",
                                 (chore.horizon.at,))
    # from the first event, every folded one is fetched to learn it is gone
    assert from_first >= 10 * from_last, (from_first, from_last)


def test_an_event_committed_after_a_later_one_was_folded_is_counted_and_folded_from_the_first(
        bare_stack: Stack):
    stack = bare_stack
    chore = Metrics(5)
    chore.run(as_beat(stack))
    before = finished_total(stack)
    with psycopg.connect(libpq_url(stack.admin_url)) as late:
        # this event takes its id first, and commits after a later one was folded
        late.execute("INSERT INTO metric_events (name, kind, label, value)"
                     " VALUES ('spacejobs_jobs_finished_total', 'bench.noop', 'completed', 1)")
        record_events(stack, 1)
        assert chore.run(as_beat(stack)) == MetricsReport(folded=1)
        late.commit()
    assert chore.run(as_beat(stack)) == MetricsReport()  # from after the later one
    assert pending(stack) == 1 and finished_total(stack) == before + 2  # /metrics counts it
    chore.horizon.runs = 0  # the next run starts from the first event
    assert chore.run(as_beat(stack)) == MetricsReport(folded=1)
    assert pending(stack) == 0 and finished_total(stack) == before + 2
