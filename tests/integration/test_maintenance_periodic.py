"""Periodic jobs made by beat's periodic chore (tasks/maintenance/periodic.py): once per period,
however many beats run, for the organization and requester the configuration names; a job whose
submit is refused is logged, and keeps no other from being made."""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timedelta

from sqlalchemy import text

from tests.kit.stack import Stack
from tests.kit.waiting import wait_until


def test_two_beats_create_each_periodic_job_once(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    stranger = stack.user(stack.org(), role="owner")
    config = json.dumps([
        {"name": "tick", "kind": "bench.noop", "organization_id": str(org),
         "requested_by": str(anna.id), "schedule": "every 2s"},
        # Not a member of org: every period's submit is refused, no job is made.
        {"name": "intruder", "kind": "bench.noop", "organization_id": str(org),
         "requested_by": str(stranger.id), "schedule": "every 2s"},
    ])
    beats = [stack.start_beat(SPACEJOBS_PERIODIC_JOBS=config, SPACEJOBS_SWEEP_INTERVAL="0.5")
             for _ in range(2)]
    # However slowly the beats start on a loaded machine, once running they must make every
    # period's job exactly once: wait for four periods, then look at what was made.
    wait_until(lambda: len(_rows(stack, org)) >= 4, 60, "four periods' jobs", interval=0.5)
    stack.retire(*beats)
    rows = _rows(stack, org)
    keys = [row.idempotency_key for row in rows]
    assert len(keys) >= 4, keys
    assert len(keys) == len(set(keys)), keys  # never twice for one period
    assert all(key.startswith("periodic:tick:") for key in keys)
    assert all(row.requested_by == anna.id for row in rows)
    periods = sorted(datetime.fromisoformat(key.removeprefix("periodic:tick:")) for key in keys)
    gaps = {later - earlier for earlier, later in itertools.pairwise(periods)}
    assert gaps == {timedelta(seconds=2)}, periods  # no period skipped while the beats ran
    both = "".join(beat.output() for beat in beats)
    assert "already submitted by another beat" in both  # the second beat saw each period taken
    assert "periodic job intruder" in both and "not submitted" in both


def _rows(stack: Stack, org) -> list:
    with stack.admin() as conn:
        return conn.execute(text(
            "SELECT idempotency_key, requested_by FROM jobs WHERE organization_id = :org"
            " ORDER BY created_at"), {"org": org}).all()
