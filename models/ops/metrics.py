"""Prometheus metrics, derived from the database at scrape time.

Why from the database: workers run on many hosts and come and go; their in-process counters
would need a scrape target each and would reset on every restart. The job rows, the worker
presence table and the trigger-maintained ``metric_counters`` are shared by all of them, so one
scrape of any web process gives the fleet's numbers, and counters survive restarts and
retention. Labels are only ``kind``, ``status``/``outcome`` (low cardinality), never an
organization or a job id.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry
from sqlalchemy import Engine

from spacejobs.models.db.queries import queries_beside
from spacejobs.models.db.transaction import transaction

Q = queries_beside(__file__)

# The same bounds as metric_buckets() in models/db/schema/35_operations.sql.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)

_HISTOGRAMS = {
    "spacejobs_job_queue_wait_seconds": "Time from submit to the first lease.",
    "spacejobs_job_duration_seconds": "Time from the first lease to the end.",
}
_COUNTERS = {
    "spacejobs_jobs_finished_total": ("Jobs that reached a terminal state.", "outcome"),
    "spacejobs_leases_expired_total": ("Leases that ran out before their job ended.", None),
    "spacejobs_stale_finishes_fenced_total": (
        "Finishes refused because a newer attempt held the lease.", None),
    "spacejobs_wakeups_published_total": ("Wake-up signals handed to the broker.", None),
    "spacejobs_wakeups_failed_total": (
        "Wake-up signals the broker did not take (the sweeper re-sends).", None),
}


class DatabaseCollector(Collector):
    def __init__(self, operator_db: Engine, *, offline_after: float) -> None:
        self._db = operator_db
        self._offline_after = offline_after

    def collect(self) -> Iterator[Metric]:
        with transaction(self._db) as conn:
            active = conn.execute(Q["active_by_status"]).all()
            oldest = conn.execute(Q["oldest_queued"]).all()
            due = conn.execute(Q["oldest_due_wait"]).all()
            counters = conn.execute(Q["metric_counters"]).all()
            online = conn.execute(Q["workers_online"], {"offline_after": self._offline_after}).scalar()

        jobs = GaugeMetricFamily("spacejobs_jobs", "Active jobs by kind and status, waiting ones included.",
                                 labels=["kind", "status"])
        for kind, status, n in active:
            jobs.add_metric([kind, status], n)
        yield jobs

        age = GaugeMetricFamily("spacejobs_oldest_queued_job_age_seconds",
                                "Age of the oldest due, unclaimed job.", labels=["kind"])
        for kind, seconds in oldest:
            age.add_metric([kind], float(seconds))
        yield age

        overdue = GaugeMetricFamily("spacejobs_oldest_due_wait_seconds",
                                    "How long past its moment the most overdue waiting job is "
                                    "(the sweeper resumes it).", labels=["kind"])
        for kind, seconds in due:
            overdue.add_metric([kind], float(seconds))
        yield overdue

        workers = GaugeMetricFamily("spacejobs_workers_online", "Worker processes seen recently.")
        workers.add_metric([], online or 0)
        yield workers

        by_name: dict[str, list[tuple[str, str, float]]] = defaultdict(list)
        for name, kind, label, value in counters:
            by_name[name].append((kind, label, float(value)))

        for name, (doc, label_name) in _COUNTERS.items():
            counter = CounterMetricFamily(name.removesuffix("_total"), doc,
                                          labels=["kind", label_name] if label_name else ["kind"])
            for kind, label, value in by_name.get(name, []):
                counter.add_metric([kind, label] if label_name else [kind], value)
            yield counter

        for name, doc in _HISTOGRAMS.items():
            histogram = HistogramMetricFamily(name, doc, labels=["kind"])
            sums = {kind: value for kind, _, value in by_name.get(name + "_sum", [])}
            buckets: dict[str, dict[float, float]] = defaultdict(dict)
            for kind, bound, value in by_name.get(name + "_bucket", []):
                buckets[kind][float(bound)] = value
            for kind, counts in buckets.items():
                running = 0.0
                cumulative: list[tuple[str, float]] = []
                for upper in (*BUCKETS, float("inf")):  # stored per bucket; exposed cumulative
                    running += counts.get(upper, 0.0)
                    cumulative.append(("+Inf" if upper == float("inf") else str(upper), running))
                histogram.add_metric([kind], cumulative, sum_value=sums.get(kind, 0.0))
            yield histogram


def render(operator_db: Engine, *, offline_after: float) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(operator_db, offline_after=offline_after))
    return generate_latest(registry)
