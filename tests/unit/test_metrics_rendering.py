"""Prometheus metrics (models/ops/metrics.py) rendered from rows a fake transaction hands the
collector: the database's per-bucket counts become Prometheus' cumulative buckets, and the only
labels are kind and status/outcome."""

from __future__ import annotations

import contextlib

import pytest
from prometheus_client.parser import text_string_to_metric_families

from spacejobs.models.ops import metrics

ROWS = {
    "active_by_status": [("projects_export", "queued", 3), ("projects_export", "leased", 1),
                         ("bench.wait", "waiting", 5)],
    "oldest_queued": [("projects_export", 12.5)],
    "oldest_due_wait": [("bench.wait", 4.25)],
    "workers_online": None,
    "metric_counters": [
        ("spacejobs_jobs_finished_total", "projects_export", "completed", 7),
        ("spacejobs_jobs_finished_total", "projects_export", "failed", 2),
        ("spacejobs_leases_expired_total", "projects_export", "", 1),
        ("spacejobs_job_duration_seconds_bucket", "projects_export", "0.1", 2),
        ("spacejobs_job_duration_seconds_bucket", "projects_export", "1", 3),
        ("spacejobs_job_duration_seconds_bucket", "projects_export", "Infinity", 1),
        ("spacejobs_job_duration_seconds_sum", "projects_export", "", 9.5),
    ],
}


class Rows:
    def __init__(self, rows):
        self.rows = rows

    def all(self):
        return self.rows

    def scalar(self):
        return self.rows


class FakeConnection:
    def __init__(self, online: int | None):
        self.online = online
        self.asked: list[tuple[str, dict | None]] = []

    def execute(self, query, params=None):
        name = next(n for n, q in metrics.Q.items() if q is query)
        self.asked.append((name, params))
        return Rows(self.online if name == "workers_online" else ROWS[name])


@pytest.fixture
def scrape(monkeypatch: pytest.MonkeyPatch):
    def run(online: int | None = 4) -> tuple[dict, FakeConnection]:
        conn = FakeConnection(online)
        monkeypatch.setattr(metrics, "transaction", lambda engine: contextlib.nullcontext(conn))
        text = metrics.render(object(), offline_after=30).decode()
        samples: dict = {"text": text}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples, conn
    return run


def test_buckets_stored_one_by_one_are_exposed_cumulative_with_a_count(scrape):
    samples, _ = scrape()
    bucket = "spacejobs_job_duration_seconds_bucket"

    def le(bound: str) -> float:
        return samples[(bucket, (("kind", "projects_export"), ("le", bound)))]

    assert [le("0.05"), le("0.1"), le("0.5"), le("1"), le("1800"), le("+Inf")] == [
        0, 2, 2, 5, 5, 6]
    assert samples[("spacejobs_job_duration_seconds_count", (("kind", "projects_export"),))] == 6
    assert samples[("spacejobs_job_duration_seconds_sum", (("kind", "projects_export"),))] == 9.5


def test_counters_carry_their_outcome_and_gauges_their_status(scrape):
    samples, _ = scrape()
    kind = ("kind", "projects_export")
    assert samples[("spacejobs_jobs_finished_total", (kind, ("outcome", "failed")))] == 2
    assert samples[("spacejobs_leases_expired_total", (kind,))] == 1
    assert samples[("spacejobs_jobs", (kind, ("status", "queued")))] == 3
    assert samples[("spacejobs_oldest_queued_job_age_seconds", (kind,))] == 12.5
    assert samples[("spacejobs_jobs", (("kind", "bench.wait"), ("status", "waiting")))] == 5
    assert samples[("spacejobs_oldest_due_wait_seconds", (("kind", "bench.wait"),))] == 4.25
    assert samples[("spacejobs_workers_online", ())] == 4


def test_every_counter_is_exposed_even_before_anything_was_counted(scrape):
    samples, _ = scrape()
    assert not any(key[0].startswith("spacejobs_wakeups_failed") for key in samples)
    assert "# TYPE spacejobs_wakeups_failed_total counter" in samples["text"]
    assert "# TYPE spacejobs_job_queue_wait_seconds histogram" in samples["text"]


def test_no_worker_seen_is_zero_online_and_the_silence_bound_is_passed_on(scrape):
    samples, conn = scrape(online=None)
    assert samples[("spacejobs_workers_online", ())] == 0
    assert ("workers_online", {"offline_after": 30}) in conn.asked


def test_labels_never_name_an_organization_or_a_job(scrape):
    samples, _ = scrape()
    assert {label for key in samples if key != "text" for label, _ in key[1]} <= {
        "kind", "status", "outcome", "le"}
