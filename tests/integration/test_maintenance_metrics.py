"""The metrics chore (tasks/maintenance/metrics.py) against PostgreSQL: the metric events jobs
leave as they move are folded into the counters, and the counters keep their sum."""

from __future__ import annotations

from sqlalchemy import text

from spacejobs.tasks.maintenance.metrics import Metrics, MetricsReport
from tests.integration.maintenance_kit import as_beat, drain_queue, new_job
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
