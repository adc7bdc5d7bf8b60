"""What a person reads about a job (webapp/status.py), beyond the journeys of test_people.py:
the measured progress is never embellished, and each ending has its own words and tone."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from spacejobs.models.jobs.holds import Reason, Waiting, holding
from spacejobs.models.jobs.records import Status
from spacejobs.models.kinds import load_kinds
from spacejobs.webapp.status import (
    FIX_FIRST,
    NEXT_STEPS,
    TRY_AGAIN,
    attempt_line,
    describe,
    label_of,
    running_line,
    waiting_words,
)
from tests.unit.test_people import job

SHOWN_AT = datetime(2026, 12, 2, 9, 30, tzinfo=UTC)


def test_a_kind_is_named_by_its_label_and_one_without_in_words_made_from_its_name():
    load_kinds(["spacejobs.demo.kinds"])
    assert label_of("projects_archive") == "Archive projects (ZIP)"
    assert label_of("thumbs.make") == "Thumbs make"  # not loaded here: its name, in words
    assert label_of("projects_report.project") == "Projects report project"


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
    (Status.FAILED, "Failed", "bad"), (Status.WAITING, "Waiting", "waiting"),
])
def test_every_state_has_its_word_and_tone(status, word, tone):
    shown = describe(job(status=status, attempts=0 if status == Status.QUEUED else 1))
    assert (shown.word, shown.tone) == (word, tone)


def test_a_failure_without_a_message_still_says_it_failed_and_what_next():
    shown = describe(job(status=Status.FAILED, attempts=1), request_id="r-1")
    assert shown.detail == "The job failed."
    assert shown.next_step == TRY_AGAIN.format(quote="the request id")


@pytest.mark.parametrize("code", sorted(NEXT_STEPS))
def test_each_known_failure_has_its_own_next_step_not_try_again(code):
    shown = describe(job(status=Status.FAILED, attempts=1, error_code=code, error_message="x"))
    assert shown.next_step == NEXT_STEPS[code].format(quote="the job id")
    assert "Try again" not in shown.next_step


@pytest.mark.parametrize("code", ["internal_error", "lease_expired", "timed_out"])
def test_a_failure_of_the_machinery_advises_a_new_job(code):
    shown = describe(job(status=Status.FAILED, attempts=3, error_code=code, error_message="x"))
    assert shown.next_step.startswith("Try again with a new job")


def test_a_kinds_own_permanent_failure_asks_to_fix_the_input_not_to_try_again():
    shown = describe(job(status=Status.FAILED, attempts=1, error_code="photo_too_large",
                         error_message="The photo is larger than 10,000 pixels on a side."))
    assert shown.next_step == FIX_FIRST and "Try again" not in shown.next_step


def test_a_job_without_a_request_id_has_its_job_id_quoted():
    shown = describe(job(status=Status.FAILED, attempts=3, error_code="internal_error"))
    assert shown.next_step.endswith("quote the job id.")


def test_only_finished_jobs_say_what_to_do_next():
    for status in (Status.QUEUED, Status.LEASED, Status.CANCEL_REQUESTED, Status.WAITING,
                   Status.COMPLETED, Status.CANCELLED):
        assert describe(job(status=status, attempts=1, error_code="internal_error")).next_step is None


# ----------------------------------------------------------------------------- waiting

def waiting(**wait) -> dict:
    return {"status": Status.WAITING, "attempts": 1, "started_at": SHOWN_AT, **wait}


def test_a_timer_says_until_when_in_utc_and_its_date_only_on_another_day():
    later_today = describe(job(**waiting(wait_until=datetime(2026, 12, 2, 14, 5, 10, tzinfo=UTC))),
                           SHOWN_AT)
    assert later_today.headline == "Waiting until 14:05:10 UTC"
    assert later_today.detail == ("It holds no worker while it waits, and carries on by itself "
                                  "at that moment.")
    assert (later_today.word, later_today.tone, later_today.progress) == ("Waiting", "waiting", None)
    tomorrow = describe(job(**waiting(wait_until=SHOWN_AT + timedelta(days=1))), SHOWN_AT)
    assert tomorrow.headline == "Waiting until 2026-12-03 09:30:00 UTC"
    # The moment is said in UTC whatever zone the database handed it in.
    zoned = datetime(2026, 12, 2, 15, 5, 10, tzinfo=UTC).astimezone(timezone(timedelta(hours=1)))
    assert describe(job(**waiting(wait_until=zoned)), SHOWN_AT).headline == \
        "Waiting until 15:05:10 UTC"


def test_a_signal_is_named_with_its_deadline_when_it_has_one():
    with_deadline = describe(job(**waiting(wait_signal="approved",
                                           wait_until=SHOWN_AT + timedelta(minutes=5))), SHOWN_AT)
    assert with_deadline.headline == "Waiting for the signal “approved”"
    assert with_deadline.detail == ("It holds no worker while it waits, and carries on by itself "
                                    "when the signal comes, or at 09:35:00 UTC at the latest.")
    without = describe(job(**waiting(wait_signal="approved")), SHOWN_AT)
    assert without.detail.endswith("when the signal comes.")


@pytest.mark.parametrize(("progress", "headline", "bar"), [
    ({"stage": "children", "done": 3, "total": 8}, "Waiting for its parts: 3 of 8 done", (3, 8)),
    ({"stage": "children", "done": 0, "total": 1}, "Waiting for its parts: 0 of 1 done", (0, 1)),
    ({"stage": "steps", "done": 2, "total": 5}, "Waiting for its steps: 2 of 5 done", (2, 5)),
    # Nothing the fan-out measured, or nothing that adds up: no numbers, no bar.
    (None, "Waiting for its parts", None),
    ({"stage": "children", "done": 9, "total": 8}, "Waiting for its parts", None),
    ({"stage": "children", "done": "3", "total": 8}, "Waiting for its parts", None),
    ({"stage": "copying", "done": 3, "total": 8}, "Waiting for its parts", None),
    ({"stage": "steps", "done": 0, "total": 0}, "Waiting for its steps", None),
    ({"stage": ["children"], "done": 1, "total": 2}, "Waiting for its parts", None),
])
def test_a_parent_says_how_many_of_its_children_are_done_as_it_measured(progress, headline, bar):
    shown = describe(job(**waiting(wait_children=5, progress=progress)), SHOWN_AT)
    assert (shown.headline, shown.progress) == (headline, bar)
    called = "steps" if "steps" in headline else "parts"
    assert shown.detail.endswith(f"carries on by itself as its {called} finish.")


def test_without_a_moment_given_the_page_is_shown_now():
    soon = datetime.now(UTC) + timedelta(seconds=30)
    shown = describe(job(**waiting(wait_until=soon)))
    assert shown.headline in {f"Waiting until {soon:%H:%M:%S} UTC",
                              f"Waiting until {soon:%Y-%m-%d %H:%M:%S} UTC"}


@pytest.mark.parametrize(("changes", "line"), [
    ({}, "none yet (at most 3)"),
    ({"status": Status.LEASED, "attempts": 1, "started_at": SHOWN_AT}, "1 of 3"),
    # it waits in the attempt it ran in: a wait uses none up
    ({"status": Status.WAITING, "attempts": 1, "started_at": SHOWN_AT},
     "1 of 3, waiting (a wait uses no attempt up)"),
    # resumed (its attempt given back for the claim to count again), or queued for a retry:
    # the attempt it goes on with, or begins, next
    ({"status": Status.QUEUED, "attempts": 0, "started_at": SHOWN_AT}, "1 of 3, next"),
    ({"status": Status.QUEUED, "attempts": 1, "started_at": SHOWN_AT}, "2 of 3, next"),
    ({"status": Status.CANCELLED, "attempts": 1, "started_at": SHOWN_AT}, "1 of 3"),
    ({"status": Status.COMPLETED, "attempts": 1, "started_at": SHOWN_AT, "kind": "workflow",
      "max_attempts": 10},
     "1 of 10; the workflow's own, to start and collect its steps: each step has its own"),
])
def test_the_attempt_a_job_is_in_is_told_as_it_is(changes, line):
    assert attempt_line(job(**changes)) == line


def test_a_job_queued_to_go_on_after_a_wait_is_not_said_to_be_new_or_failed():
    resumed = describe(job(status=Status.QUEUED, attempts=0, started_at=SHOWN_AT))
    assert resumed.headline == "Queued — it goes on shortly, in the same attempt"
    assert resumed.detail is None


# ----------------------------------------------------------------------------- held back


def test_a_sequence_holds_a_job_before_a_delay_or_a_rate_limit():
    behind = uuid.uuid4()
    later = SHOWN_AT + timedelta(minutes=5)
    assert holding(later, behind, later) == Waiting(Reason.SEQUENCE, behind=behind)


@pytest.mark.parametrize(("delayed", "limited", "reason", "until"), [
    (10, None, Reason.DELAYED, 10),
    (None, 10, Reason.RATE_LIMIT, 10),
    (20, 10, Reason.DELAYED, 20),  # the later of the two is what it waits for
    (10, 20, Reason.RATE_LIMIT, 20),
])
def test_a_delay_and_a_rate_limit_the_later_one_holds(delayed, limited, reason, until):
    def at(minutes):
        return None if minutes is None else SHOWN_AT + timedelta(minutes=minutes)
    assert holding(at(delayed), None, at(limited)) == Waiting(reason, until=at(until))


def test_a_queued_job_nothing_holds_back_has_no_reason():
    assert holding(None, None, None) is None


def test_a_held_queued_job_says_why_in_its_headline():
    until = SHOWN_AT + timedelta(minutes=2)
    shown = describe(job(status=Status.QUEUED, attempts=0), SHOWN_AT,
                     held=Waiting(Reason.RATE_LIMIT, until=until))
    assert shown.headline == "Queued — behind a rate limit until 09:32:00 UTC"
    shown = describe(job(status=Status.QUEUED, attempts=0), SHOWN_AT,
                     held=Waiting(Reason.DELAYED, until=until + timedelta(days=1)))
    assert shown.headline == "Queued — delayed until 2026-12-03 09:32:00 UTC"


def test_a_retry_held_by_its_backoff_says_when_it_runs_again():
    shown = describe(job(status=Status.QUEUED, attempts=1, error_message="It broke."), SHOWN_AT,
                     held=Waiting(Reason.DELAYED, until=SHOWN_AT + timedelta(seconds=30)))
    assert shown.headline == "Retrying — attempt 2 of 3"
    assert "It will run again at 09:30:30 UTC or soon after" in shown.detail


@pytest.mark.parametrize(("why", "words"), [
    (Waiting(Reason.SIGNAL, signal="approval"), "Waiting for the signal “approval”"),
    (Waiting(Reason.CHILDREN, children=3), "Waiting for its children to finish"),
    (Waiting(Reason.MOMENT, until=SHOWN_AT), "Waiting until 09:30:00 UTC"),
    (Waiting(Reason.RATE_LIMIT, until=SHOWN_AT), "Queued behind its kind's rate limit until 09:30:00 UTC"),
])
def test_each_reason_has_its_words(why, words):
    assert waiting_words(why, SHOWN_AT) == words
