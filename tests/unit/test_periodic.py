"""Periodic schedules: the period a moment belongs to, the same for every beat."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from spacejobs.models.errors import InvalidRequest, UnknownKind
from spacejobs.models.jobs.periodic import PeriodicEntry, Schedule, resolve
from spacejobs.models.kinds import load_kinds

load_kinds()


@pytest.mark.parametrize("text, now, period", [
    ("every 2s", "2026-12-01T04:00:03.900+00:00", "2026-12-01T04:00:02+00:00"),
    ("every 5m", "2026-12-01T04:07:00+00:00", "2026-12-01T04:05:00+00:00"),
    ("every 1d", "2026-12-01T23:59:59+00:00", "2026-12-01T00:00:00+00:00"),
    ("*/15 * * * *", "2026-12-01T04:44:59+00:00", "2026-12-01T04:30:00+00:00"),
    ("*/15 * * * *", "2026-12-01T04:45:00+00:00", "2026-12-01T04:45:00+00:00"),
    ("0 3 * * *", "2026-12-01T02:00:00+00:00", "2026-11-30T03:00:00+00:00"),
])
def test_the_period_is_the_latest_fire_time_at_or_before_now(text, now, period):
    assert Schedule.parse(text).period(datetime.fromisoformat(now)) == datetime.fromisoformat(period)


def test_two_beats_a_second_apart_in_one_period_agree():
    schedule = Schedule.parse("every 10s")
    first = schedule.period(datetime(2026, 12, 1, 4, 0, 1, tzinfo=UTC))
    assert schedule.period(datetime(2026, 12, 1, 4, 0, 9, 999, tzinfo=UTC)) == first


@pytest.mark.parametrize("text", ["every 0s", "every 5 parsecs", "61 * * * *", "", "daily"])
def test_a_bad_schedule_is_refused_with_a_sentence(text):
    with pytest.raises(InvalidRequest):
        Schedule.parse(text)


def test_configuration_is_checked_before_beat_runs():
    entry = dict(name="nightly", organization_id=uuid.uuid4(), requested_by=uuid.uuid4())
    assert resolve([PeriodicEntry(kind="projects_export", schedule="0 3 * * *", **entry)])
    with pytest.raises(InvalidRequest, match="no schedule"):
        resolve([PeriodicEntry(kind="projects_export", **entry)])
    with pytest.raises(UnknownKind):
        resolve([PeriodicEntry(kind="no.such.kind", schedule="every 1h", **entry)])
