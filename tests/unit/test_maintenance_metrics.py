"""The metrics chore (tasks/maintenance/metrics.py) with the fold replaced by a fake: one bounded
fold a run, recorded as the sweeper's, how many events it folded, and where each run starts."""

from __future__ import annotations

from types import SimpleNamespace

from spacejobs.models.jobs.store import Folded
from spacejobs.models.settings import get_settings
from spacejobs.tasks.maintenance import metrics
from spacejobs.tasks.maintenance.metrics import Metrics, MetricsReport
from tests.unit.maintenance_fakes import Transactions, process


def test_one_bounded_fold_a_run(monkeypatch):
    batches = []

    def fold_metrics(conn, *, batch, after):
        batches.append(batch)
        return Folded(folded=42, last_id=99)

    transactions = Transactions()
    monkeypatch.setattr(metrics, "transaction", transactions)
    monkeypatch.setattr(metrics, "store", SimpleNamespace(fold_metrics=fold_metrics))
    report = Metrics.from_settings(get_settings()).run(process())
    assert report == MetricsReport(folded=42)
    assert batches == [Metrics.batch] and transactions.actors == ["sweeper"]


def test_each_run_folds_after_the_last_event_the_one_before_folded_and_now_and_then_from_the_first(
        monkeypatch):
    starts = []

    def fold_metrics(conn, *, batch, after):
        starts.append(after)
        # nothing folded: the function answers the id it was given
        return Folded(folded=5, last_id=(after or 0) + 5) if len(starts) % 3 else Folded(0, after)

    monkeypatch.setattr(metrics, "transaction", Transactions())
    monkeypatch.setattr(metrics, "store", SimpleNamespace(fold_metrics=fold_metrics))
    chore = Metrics.from_settings(get_settings())
    chore.horizon.full_every = 5
    for _ in range(6):
        chore.run(process())
    # the third fold folds nothing and answers the id it was given; the sixth run, five after
    # the first, starts from the first event again
    assert starts == [None, 5, 10, 10, 15, None]
