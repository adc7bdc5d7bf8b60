"""The pages' pure parts: what each state says, the password challenge, the next= guard, the
events stream's ids, the demo banner."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from argon2 import PasswordHasher

from spacejobs.models.jobs.records import Job, Status
from spacejobs.models.settings import reload_settings
from spacejobs.models.tenancy import passwords
from spacejobs.models.tenancy.passwords import answer_challenge, hash_password
from spacejobs.webapp.api import event_id
from spacejobs.webapp.cli import banner
from spacejobs.webapp.status import describe
from spacejobs.webapp.ui import safe_next

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def job(**changes) -> Job:
    base = Job(id=uuid.uuid4(), organization_id=uuid.uuid4(), requested_by=uuid.uuid4(),
               kind="projects_export", status=Status.QUEUED, attempts=0, max_attempts=3,
               progress=None, error_code=None, error_message=None, dedup_key=None, run_after=NOW,
               created_at=NOW, updated_at=NOW, started_at=None, finished_at=None,
               cancel_requested_at=None, leased_by=None, lease_until=None, result_expired_at=None)
    return dataclasses.replace(base, **changes)


def test_accepted_is_not_done():
    shown = describe(job())
    assert shown.headline == "Queued — accepted, not started yet" and shown.progress is None


def test_running_shows_the_measured_stage_and_a_bar_only_with_a_measured_total():
    assert describe(job(status=Status.LEASED, attempts=1)).headline == "Running — started"
    unmeasured = describe(job(status=Status.LEASED, attempts=1, progress={"stage": "reading projects"}))
    assert (unmeasured.headline, unmeasured.progress) == ("Running — reading projects", None)
    measured = describe(job(status=Status.LEASED, attempts=1,
                            progress={"stage": "writing the file", "done": 3, "total": 8}))
    assert (measured.headline, measured.progress) == ("Running — writing the file 3/8", (3, 8))
    empty = describe(job(status=Status.LEASED, attempts=1,
                         progress={"stage": "writing the file", "done": 0, "total": 0}))
    assert empty.progress is None  # no bar for a total of nothing


def test_a_retry_is_the_same_job_not_a_new_one():
    waiting = describe(job(status=Status.QUEUED, attempts=1, error_code="internal_error",
                           error_message="The job failed because of an internal error."))
    assert waiting.headline == "Retrying — attempt 2 of 3"
    assert "the same job, with the same id" in waiting.detail
    running = describe(job(status=Status.LEASED, attempts=2, progress={"stage": "s", "done": 1, "total": 2}))
    assert running.headline == "Retrying — attempt 2 of 3" and running.progress == (1, 2)
    assert running.detail.startswith("Running — s 1/2")


def test_a_cancel_request_is_not_yet_a_cancellation():
    asked = describe(job(status=Status.CANCEL_REQUESTED, attempts=1))
    assert asked.headline == "Cancel requested" and "still running" in asked.detail
    assert describe(job(status=Status.CANCELLED)).headline == "Cancelled"
    assert describe(job(status=Status.COMPLETED, attempts=1)).headline == "Completed"


@pytest.mark.parametrize(("code", "step"), [
    ("internal_error", "Try again with a new job. If it fails again, contact support"),
    ("lease_expired", "contact support and quote the request id"),
    ("requester_not_member", "Ask a member of the organization to start it again."),
    ("organization_read_only", "Ask an owner to make it active again"),
])
def test_a_failure_says_what_to_do_next(code, step):
    shown = describe(job(status=Status.FAILED, attempts=3, error_code=code, error_message="It broke."),
                     request_id="r-1")
    assert shown.headline == "Failed" and shown.detail == "It broke." and step in shown.next_step


def test_the_web_computes_the_same_argon2id_string_without_ever_holding_the_digest():
    stored = hash_password("correct horse battery staple")
    challenge = stored.rsplit("$", 1)[0]
    assert answer_challenge(challenge, "correct horse battery staple") == stored
    assert answer_challenge(challenge, "correct horse battery stapler") != stored
    assert PasswordHasher().verify(stored, "correct horse battery staple")
    assert answer_challenge("$argon2i$v=19$m=8,t=1,p=1$c2FsdHNhbHQ", "x") is None  # only argon2id


def costs_of(stored: str) -> str:
    return stored.split("$")[3]


def test_new_passwords_take_the_configured_argon2id_costs_and_old_ones_still_answer(
        monkeypatch: pytest.MonkeyPatch):
    for name in ("SPACEJOBS_PASSWORD_MEMORY_KIB", "SPACEJOBS_PASSWORD_TIME_COST",
                 "SPACEJOBS_PASSWORD_PARALLELISM"):
        monkeypatch.delenv(name, raising=False)
    try:
        reload_settings()
        # the defaults: RFC 9106's second recommendation, as argon2-cffi has it
        before = hash_password("correct horse battery staple")
        assert costs_of(before) == "m=65536,t=3,p=4"
        monkeypatch.setenv("SPACEJOBS_PASSWORD_MEMORY_KIB", "19456")
        monkeypatch.setenv("SPACEJOBS_PASSWORD_TIME_COST", "2")
        monkeypatch.setenv("SPACEJOBS_PASSWORD_PARALLELISM", "1")
        reload_settings()
        after = hash_password("correct horse battery staple")
        assert costs_of(after) == "m=19456,t=2,p=1"
        # A sign-in hashes with the costs its stored hash names, whatever the settings now say.
        for stored in (before, after):
            challenge = stored.rsplit("$", 1)[0]
            assert answer_challenge(challenge, "correct horse battery staple") == stored
            assert PasswordHasher().verify(stored, "correct horse battery staple")
    finally:
        monkeypatch.undo()
        reload_settings()


class NoSuchEmail:
    """A connection whose every answer is "no such row": an email nobody signs in with."""

    def execute(self, *_args: object) -> NoSuchEmail:
        return self

    def scalar_one_or_none(self) -> None:
        return None


def test_an_unknown_email_is_hashed_at_the_costs_a_new_password_takes(
        monkeypatch: pytest.MonkeyPatch):
    """So that a sign-in with an unknown email takes the time of a known one with a wrong
    password, under whatever costs the settings name."""
    hashed_against: list[str] = []
    monkeypatch.setattr(passwords, "answer_challenge",
                        lambda challenge, _password: hashed_against.append(challenge))
    try:
        for memory, time_cost, lanes in (("19456", "2", "1"), ("24576", "3", "2")):
            monkeypatch.setenv("SPACEJOBS_PASSWORD_MEMORY_KIB", memory)
            monkeypatch.setenv("SPACEJOBS_PASSWORD_TIME_COST", time_cost)
            monkeypatch.setenv("SPACEJOBS_PASSWORD_PARALLELISM", lanes)
            reload_settings()
            assert passwords.check_login(NoSuchEmail(), "nobody@example.org", "a guess at it") is None
            assert costs_of(hashed_against[-1]) == costs_of(hash_password("a new password"))
            assert costs_of(hashed_against[-1]) == f"m={memory},t={time_cost},p={lanes}"
    finally:
        monkeypatch.undo()
        reload_settings()


@pytest.mark.parametrize(("target", "kept"), [
    ("/orgs/1/jobs?status=failed", True), ("/", True), ("", False),
    ("https://evil.example", False), ("//evil.example", False), ("/\\evil.example", False),
    ("javascript:alert(1)", False), ("/ok\r\nSet-Cookie: x=1", False), ("evil.example/x", False),
])
def test_next_stays_on_this_site(target, kept):
    assert (safe_next(target) == target) is kept


def test_an_event_id_names_a_visible_state():
    a = job(status=Status.LEASED, attempts=1, progress={"stage": "s", "done": 1, "total": 3})
    assert event_id(a) == event_id(dataclasses.replace(a, updated_at=datetime.now(UTC)))  # a heartbeat
    assert event_id(a) != event_id(dataclasses.replace(a, progress={"stage": "s", "done": 2, "total": 3}))
    assert event_id(a).startswith("1.leased.")


def test_an_event_id_names_what_a_waiting_job_waits_for():
    # Between two polls a job may be resumed and wait again, for something else, keeping its
    # attempt, status and progress: the id still differs, so the page shows the new wait.
    first = job(status=Status.WAITING, attempts=1, wait_signal="approved")
    second = dataclasses.replace(first, wait_signal="countersigned")
    assert event_id(first) != event_id(second)
    assert event_id(first) == event_id(dataclasses.replace(first, updated_at=datetime.now(UTC)))
    # What a job that does not wait is left with (a cleared column) changes nothing.
    leased = job(status=Status.LEASED, attempts=1)
    assert event_id(leased) == event_id(dataclasses.replace(leased, wait_signal="stale"))


def test_the_demo_banner_says_where_to_click_and_gives_every_password():
    users = [{"email": "anna@acme.example", "role": "owner", "org_name": "Acme", "org_id": "o1",
              "token": "sj_t1", "password": "pw-anna"},
             {"email": "olga@ops.example", "role": "operator", "org_name": "-", "org_id": "-",
              "token": "sj_t2", "password": "pw-olga"}]
    text = banner("http://127.0.0.1:5000", users)
    assert "open http://127.0.0.1:5000/login and sign in as anna@acme.example" in text
    assert "pw-anna" in text and "pw-olga" in text and "sj_t1" in text
    assert 'press "Export projects"' in text
    assert "servers.env" not in text  # only the demo's own run knows where its servers are


def test_the_demo_banner_says_where_the_servers_urls_are_and_how_to_source_them():
    users = [{"email": "anna@acme.example", "role": "owner", "org_name": "Acme", "org_id": "o1",
              "token": "sj_t1", "password": "pw-anna"}]
    text = banner("http://127.0.0.1:5000", users, Path("/home/ada/my demo/servers.env"))
    assert "are in /home/ada/my demo/servers.env" in text
    assert "set -a; . '/home/ada/my demo/servers.env'; set +a" in text
