"""The orphan-sweep chore (tasks/maintenance/result_orphans.py) with the sweep replaced by a
fake: it sweeps the process's results store with the configured grace and reports counts (the
missing rows' ids are the sweep's own warning, not the report's)."""

from __future__ import annotations

import uuid

import pytest

from spacejobs.models.results.sweep import OrphanReport
from spacejobs.models.settings import get_settings
from spacejobs.tasks.maintenance import result_orphans
from spacejobs.tasks.maintenance.result_orphans import ResultOrphans, ResultOrphansReport
from tests.unit.maintenance_fakes import FakeResults, process


def test_the_sweep_runs_on_the_process_store_with_the_configured_grace(monkeypatch):
    calls = []

    def sweep_orphans(engine, store, *, grace):
        calls.append((engine, store, grace))
        return OrphanReport(listed=9, deleted=2, young=3, foreign=1,
                            missing=[uuid.uuid4(), uuid.uuid4()])

    monkeypatch.setattr(result_orphans, "sweep_orphans", sweep_orphans)
    results = FakeResults()
    report = ResultOrphans.from_settings(get_settings()).run(process(results=results))
    assert calls == [("engine", results, get_settings().results_orphan_grace)]
    assert report == ResultOrphansReport(listed=9, deleted=2, young=3, foreign=1, missing=2)


def test_its_cadence_is_the_results_sweep_interval():
    settings = get_settings()
    assert ResultOrphans.from_settings(settings).interval == settings.results_sweep_interval
    assert not ResultOrphans.frequent


def test_a_store_that_cannot_be_listed_fails_the_run(monkeypatch):
    def unreachable(engine, store, *, grace):
        raise OSError("store unreachable")

    monkeypatch.setattr(result_orphans, "sweep_orphans", unreachable)
    # Beat's schedule logs it and tries again at the next run (test_maintenance_schedule.py).
    with pytest.raises(OSError):
        ResultOrphans(600).run(process())
