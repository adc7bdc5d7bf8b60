"""The JSON API's request bodies (webapp/bodies.py): strict, bounded, and a time is the UTC
instant it names."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from spacejobs.models.jobs.service import MAX_BATCH, MAX_PRIORITY, MIN_PRIORITY
from spacejobs.webapp.bodies import IDEMPOTENCY_KEY, CreateProject, SubmitBatch, SubmitJob


def refused_fields(model, body) -> set[str]:
    with pytest.raises(ValidationError) as refused:
        model.model_validate(body)
    return {".".join(str(p) for p in error["loc"]) for error in refused.value.errors()}


def test_a_submit_needs_only_a_kind_and_has_defaults_for_the_rest():
    job = SubmitJob.model_validate({"kind": "projects_export"})
    assert (job.params, job.dedup_key, job.run_after, job.priority) == (None, None, None, 0)


@pytest.mark.parametrize(("body", "field"), [
    ({"kind": "projects_export", "organization_id": "x"}, "organization_id"),  # no extra fields
    ({"kind": ""}, "kind"), ({"kind": "k" * 65}, "kind"), ({}, "kind"), ({"kind": 3}, "kind"),
    ({"kind": "k", "dedup_key": ""}, "dedup_key"), ({"kind": "k", "dedup_key": "d" * 201}, "dedup_key"),
    ({"kind": "k", "params": ["a"]}, "params"),
    ({"kind": "k", "priority": MAX_PRIORITY + 1}, "priority"),
    ({"kind": "k", "priority": MIN_PRIORITY - 1}, "priority"),
    ({"kind": "k", "priority": "5"}, "priority"),  # strict: no strings taken for numbers
    ({"kind": "k", "priority": 1.0}, "priority"),
    ({"kind": "k", "priority": True}, "priority"),
    ({"kind": "k", "run_after": "2026-12-01T04:00:00"}, "run_after"),  # no zone: which instant?
    ({"kind": "k", "run_after": "tomorrow"}, "run_after"),
])
def test_a_submit_outside_its_bounds_names_the_field(body, field):
    assert field in refused_fields(SubmitJob, body)


def test_the_priority_bounds_themselves_are_allowed():
    for priority in (MIN_PRIORITY, MAX_PRIORITY):
        assert SubmitJob.model_validate({"kind": "k", "priority": priority}).priority == priority


def test_a_time_with_an_offset_is_stored_as_the_utc_instant_it_names():
    job = SubmitJob.model_validate({"kind": "k", "run_after": "2026-12-01T04:00:00-07:00"})
    assert job.run_after == datetime(2026, 12, 1, 11, 0, tzinfo=UTC)
    assert job.run_after.utcoffset().total_seconds() == 0


def test_a_time_postgresql_cannot_hold_is_refused_not_a_500():
    assert "run_after" in refused_fields(SubmitJob, {"kind": "k", "run_after": "0001-01-01T00:00:00+01:00"})


def test_a_batch_holds_one_to_the_most_jobs_each_checked_where_it_stands():
    assert len(SubmitBatch.model_validate({"jobs": [{"kind": "k"}] * MAX_BATCH}).jobs) == MAX_BATCH
    assert "jobs" in refused_fields(SubmitBatch, {"jobs": []})
    assert "jobs" in refused_fields(SubmitBatch, {"jobs": [{"kind": "k"}] * (MAX_BATCH + 1)})
    assert refused_fields(SubmitBatch, {"jobs": [{"kind": "k"}, {"kind": "k", "x": 1}]}) == {"jobs.1.x"}


def test_a_project_has_a_name_and_a_bounded_description():
    assert CreateProject.model_validate({"name": "Moon"}).description == ""
    assert "name" in refused_fields(CreateProject, {"name": ""})
    assert "name" in refused_fields(CreateProject, {"name": "n" * 201})
    assert "description" in refused_fields(CreateProject, {"name": "n", "description": "d" * 2001})
    assert "owner" in refused_fields(CreateProject, {"name": "n", "owner": "me"})


@pytest.mark.parametrize(("key", "taken"), [
    ("order-42", True), (" ~printable~ ", True), ("k" * 200, True),
    ("", False), ("k" * 201, False), ("tab\there", False), ("caf\u00e9", False), ("nul\x00", False),
])
def test_an_idempotency_key_is_1_to_200_printable_ascii_characters(key, taken):
    assert (IDEMPOTENCY_KEY.fullmatch(key) is not None) is taken
