"""What a person reads about a job (webapp/status.py), beyond the journeys of test_people.py:
the measured progress is never embellished, and each ending has its own words and tone."""

from __future__ import annotations

import pytest

from models.jobs.records import Status
from tests.unit.test_people import job
from webapp.status import NEXT_STEPS, TRY_AGAIN, describe, label_of, running_line


def test_a_kind_is_named_in_words_and_an_unknown_one_as_it_is():
    assert label_of("projects_archive") == "Archive projects (ZIP)"
    assert label_of("bench.noop") == "bench.noop"


@pytest.mark.parametrize(("progress", "line", "bar"), [
    (None, "Running — started", None),
    ({}, "Running — started", None),
    ({"done": 3, "total": 8}, "Running — started", None),  # no stage: nothing measured to say
    ({"stage": "copying", "done": 9, "total": 8}, "Running — copying 9/8", (8, 8)),  # bar capped
    ({"stage": "copying", "done": "3", "total": 8}, "Running — copying", None),
    ({"stage": "copying", "done": 3}, "Running — copying", None),
    ({"stage": "copying", "done": 1, "total": -2}, "Running — copying 1/-2", None),
])
def test_the_running_line_says_only_what_the_job_measured(progress, line, bar):
    assert running_line(job(status=Status.LEASED, attempts=1, progress=progress)) == (line, bar)


def test_a_retry_waiting_says_why_the_last_attempt_did_not_succeed_only_when_known():
    known = describe(job(status=Status.QUEUED, attempts=2, error_message="The lease ran out."))
    assert known.detail.startswith("Attempt 2 did not succeed (The lease ran out.).")
    unknown = describe(job(status=Status.QUEUED, attempts=2))
    assert unknown.detail.startswith("Attempt 2 did not succeed. It will run again")
    assert known.word == unknown.word == "Retrying" and known.tone == "waiting"


def test_a_cancel_request_shows_where_the_job_is_but_no_bar():
    asked = describe(job(status=Status.CANCEL_REQUESTED, attempts=1,
                         progress={"stage": "zipping", "done": 2, "total": 5}))
    assert asked.progress is None
    assert asked.detail.endswith("until then it is still running (zipping 2/5).")


@pytest.mark.parametrize(("status", "word", "tone"), [
    (Status.QUEUED, "Queued", "waiting"), (Status.LEASED, "Running", "running"),
    (Status.CANCEL_REQUESTED, "Cancel requested", "running"),
    (Status.CANCELLED, "Cancelled", "neutral"), (Status.COMPLETED, "Completed", "good"),
    (Status.FAILED, "Failed", "bad"),
])
def test_every_state_has_its_word_and_tone(status, word, tone):
    shown = describe(job(status=status, attempts=0 if status == Status.QUEUED else 1))
    assert (shown.word, shown.tone) == (word, tone)


def test_a_failure_without_a_message_still_says_it_failed_and_what_next():
    shown = describe(job(status=Status.FAILED, attempts=1))
    assert shown.detail == "The job failed." and shown.next_step == TRY_AGAIN


@pytest.mark.parametrize("code", sorted(NEXT_STEPS))
def test_each_known_failure_has_its_own_next_step_not_try_again(code):
    shown = describe(job(status=Status.FAILED, attempts=1, error_code=code, error_message="x"))
    assert shown.next_step == NEXT_STEPS[code] != TRY_AGAIN


def test_only_finished_jobs_say_what_to_do_next():
    for status in (Status.QUEUED, Status.LEASED, Status.CANCEL_REQUESTED, Status.COMPLETED,
                   Status.CANCELLED):
        assert describe(job(status=status, attempts=1, error_code="internal_error")).next_step is None
