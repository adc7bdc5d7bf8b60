"""A parent job's list of steps in words (webapp/status.py): each step's status says what the
job page would say of that job, a workflow's step is named, a fan-out's part numbered, a step
that is no job yet says whether it may still run, and the list knows when it may still move."""

from __future__ import annotations

import uuid

import pytest

from spacejobs.models.jobs.records import Status
from spacejobs.models.jobs.store import Step, Steps
from spacejobs.webapp.status import describe, short_status, step_list
from tests.unit.test_people import job


@pytest.mark.parametrize("status", list(Status))
@pytest.mark.parametrize("attempts", [0, 1, 2])
def test_a_steps_word_and_tone_are_those_of_its_own_page(status, attempts):
    if status != Status.QUEUED and attempts == 0 and status != Status.WAITING:
        attempts = 1  # a job that ran has used an attempt
    shown = describe(job(status=status, attempts=attempts))
    assert short_status(status, attempts) == (shown.word, shown.tone)


def step(place: int, status: Status | None, *, name: str | None = None, attempts: int = 1,
         error_code: str | None = None) -> Step:
    return Step(place, name, "bench.noop", uuid.uuid4() if status else None, status,
                attempts if status else 0, error_code)


def test_a_workflows_steps_are_named_and_one_not_started_yet_has_no_link():
    parent = job(kind="workflow", status=Status.WAITING, attempts=1)
    shown = step_list(parent, Steps([step(0, Status.COMPLETED, name="extract"),
                                     step(1, Status.LEASED, name="load", attempts=2),
                                     step(2, None, name="report")], 3))
    assert shown.called == "steps" and shown.more == 0 and shown.live
    assert [(line.name, line.word, line.tone) for line in shown.lines] == [
        ("extract", "Completed", "good"), ("load", "Retrying", "running"),
        ("report", "Not started", "neutral")]
    assert shown.lines[2].job_id is None and shown.lines[2].status == "none"


def test_a_step_of_an_ended_workflow_that_never_became_a_job_was_skipped():
    parent = job(kind="workflow", status=Status.FAILED, attempts=1, error_code="steps_failed")
    shown = step_list(parent, Steps([step(0, Status.FAILED, name="boom", error_code="boom"),
                                     step(1, None, name="after")], 2))
    assert [(line.word, line.error_code) for line in shown.lines] == [("Failed", "boom"),
                                                                      ("Skipped", None)]
    assert not shown.live


def test_a_fan_outs_parts_are_numbered_from_one_and_only_a_failure_shows_its_code():
    parent = job(kind="test.fan", status=Status.COMPLETED, attempts=1)
    shown = step_list(parent, Steps([step(0, Status.COMPLETED, name="ignored"),
                                     step(1, Status.COMPLETED, error_code="lease_expired")], 5))
    assert [line.name for line in shown.lines] == ["#1", "#2"]
    assert shown.called == "parts" and shown.more == 3
    assert [line.error_code for line in shown.lines] == [None, None]  # a retry's old code


def test_a_kinds_own_workflow_calls_its_children_steps_as_its_headline_does():
    parent = job(kind="projects_report", status=Status.WAITING, attempts=1, wait_children=2,
                 progress={"stage": "steps", "done": 1, "total": 3})
    shown = step_list(parent, Steps([step(0, Status.COMPLETED), step(1, Status.LEASED)], 3))
    assert shown.called == "steps" and describe(parent).headline.startswith("Waiting for its steps")
    assert [line.name for line in shown.lines] == ["#1", "#2"]  # named only in a workflow's params


def test_a_finished_parent_with_a_step_still_stopping_stays_live():
    parent = job(kind="workflow", status=Status.CANCELLED, attempts=1)
    stopping = step_list(parent, Steps([step(0, Status.CANCEL_REQUESTED, name="long")], 1))
    assert stopping.live and stopping.lines[0].word == "Cancel requested"
    assert not step_list(parent, Steps([], 0)).live  # a job without steps has no list to follow
