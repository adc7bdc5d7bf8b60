"""The metrics chore (tasks/maintenance/metrics.py) with the fold replaced by a fake: one bounded
fold a run, recorded as the sweeper's, and how many events it folded."""

from __future__ import annotations

from types import SimpleNamespace

from spacejobs.models.settings import get_settings
from spacejobs.tasks.maintenance import metrics
from spacejobs.tasks.maintenance.metrics import Metrics, MetricsReport
from tests.unit.maintenance_fakes import Transactions, process


def test_one_bounded_fold_a_run(monkeypatch):
    batches = []

    def fold_metrics(conn, *, batch):
        batches.append(batch)
        return 42

    transactions = Transactions()
    monkeypatch.setattr(metrics, "transaction", transactions)
    monkeypatch.setattr(metrics, "store", SimpleNamespace(fold_metrics=fold_metrics))
    report = Metrics.from_settings(get_settings()).run(process())
    assert report == MetricsReport(folded=42)
    assert batches == [Metrics.batch] and transactions.actors == ["sweeper"]
