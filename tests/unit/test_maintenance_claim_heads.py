"""The claim-heads chore (tasks/maintenance/claim_heads.py) with the database's move replaced by a
fake: one move a run with the lag the settings give and the chore's idle time, as a statement
alone (its lock never outlives it), each run going on after the last organization the one
before visited; a run that met an open transaction making jobs claimable says so."""

from __future__ import annotations

import contextlib
import uuid
from types import SimpleNamespace

from spacejobs.models.jobs.store import HeadsAdvanced
from spacejobs.models.settings import Settings
from spacejobs.tasks.maintenance import claim_heads
from spacejobs.tasks.maintenance.claim_heads import ClaimHeads, ClaimHeadsReport
from tests.unit.maintenance_fakes import process


def test_one_move_a_run_with_the_configured_lag(monkeypatch):
    calls = []
    lasts = [uuid.uuid4(), uuid.uuid4()]

    def advance_claim_heads(conn, *, lag, idle, after, orgs):
        calls.append((lag, idle, after, orgs))
        return HeadsAdvanced(moved=3, last_org=lasts[len(calls) - 1])

    alone = []
    monkeypatch.setattr(claim_heads, "statement_alone",
                        lambda engine: alone.append(engine) or contextlib.nullcontext("conn"))
    monkeypatch.setattr(claim_heads, "store",
                        SimpleNamespace(advance_claim_heads=advance_claim_heads))
    chore = ClaimHeads.from_settings(Settings(claim_head_lag=2.5,
                                              maintenance_claim_heads_interval=0.5))
    assert chore.interval == 0.5
    assert chore.run(process()) == ClaimHeadsReport(moved=3)
    assert chore.run(process()) == ClaimHeadsReport(moved=3)
    slice_ = ClaimHeads.orgs_per_run
    assert calls == [(2.5, ClaimHeads.idle, None, slice_), (2.5, ClaimHeads.idle, lasts[0], slice_)]
    assert alone == ["engine", "engine"] and chore.after == lasts[1]


def test_a_run_that_met_an_open_claimable_transaction_reports_busy(monkeypatch):
    monkeypatch.setattr(claim_heads, "statement_alone",
                        lambda engine: contextlib.nullcontext("conn"))
    monkeypatch.setattr(claim_heads, "store",
                        SimpleNamespace(advance_claim_heads=lambda conn, *, lag, idle, after, orgs:
                                        HeadsAdvanced(moved=None, last_org=after)))
    report = ClaimHeads.from_settings(Settings()).run(process())
    assert report == ClaimHeadsReport(moved=0, busy=1)
    report.add(ClaimHeadsReport(moved=2))  # beat adds up a frequent chore's runs
    assert report.as_dict() == {"moved": 2, "busy": 1}
