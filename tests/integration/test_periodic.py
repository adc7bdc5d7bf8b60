"""Periodic jobs made by beat: once per period, however many beats run, for the organization and
requester the configuration names."""

from __future__ import annotations

import json
import time

from sqlalchemy import text

from tests.kit.stack import Stack


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
    started = time.time()
    time.sleep(7)
    stack.retire(*beats)
    elapsed = time.time() - started
    with stack.admin() as conn:
        rows = conn.execute(text(
            "SELECT idempotency_key, requested_by, request_id FROM jobs WHERE organization_id = :org"
            " ORDER BY created_at"), {"org": org}).all()
    keys = [row.idempotency_key for row in rows]
    assert len(keys) == len(set(keys)), keys  # never twice for one period
    assert all(key.startswith("periodic:tick:") for key in keys)
    assert all(row.requested_by == anna.id for row in rows)
    assert int(elapsed / 2) - 1 <= len(keys) <= int(elapsed / 2) + 2
    both = "".join(beat.output() for beat in beats)
    assert "already submitted by another beat" in both  # the second beat saw each period taken
    assert "periodic job intruder" in both and "not submitted" in both
