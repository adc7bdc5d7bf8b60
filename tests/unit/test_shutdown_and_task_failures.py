"""A worker's graceful shutdown (tasks/shutdown.py) with a clock the test moves, and a task's
failure as Celery is told of it (tasks/task_failures.py)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from sqlalchemy.exc import DataError

from tasks import shutdown
from tasks.task_failures import TaskFailed, reported_without_messages


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [100.0]
    monkeypatch.setattr(shutdown, "time", SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(shutdown, "_stop_at", None)
    monkeypatch.setattr(shutdown, "grace", lambda: 20.0)
    return now


def test_before_a_stop_nothing_is_released(clock):
    assert not shutdown.stop_requested() and not shutdown.release_due()
    clock[0] += 10_000
    assert not shutdown.release_due()


def test_running_jobs_go_on_for_the_grace_and_are_given_back_after_it(clock):
    shutdown.request_stop()
    assert shutdown.stop_requested() and not shutdown.release_due()
    clock[0] += 19.9
    assert not shutdown.release_due()
    clock[0] += 0.1
    assert shutdown.release_due()


def test_a_second_sigterm_does_not_extend_the_grace(clock):
    shutdown.request_stop()
    clock[0] += 15
    shutdown.request_stop()
    clock[0] += 5
    assert shutdown.release_due()


def test_no_grace_gives_jobs_back_at_once(clock, monkeypatch):
    monkeypatch.setattr(shutdown, "grace", lambda: 0.0)
    shutdown.request_stop()
    assert shutdown.release_due()


def test_the_main_process_keeps_celerys_own_sigterm_handler(monkeypatch):
    installed = []
    monkeypatch.setattr(shutdown, "_in_forked_child", False)
    monkeypatch.setattr(shutdown, "_installed", False)
    monkeypatch.setattr(shutdown, "signal", SimpleNamespace(
        SIGTERM=15, signal=lambda signum, handler: installed.append(signum)))
    shutdown.install_in_pool_child()
    assert installed == []
    monkeypatch.setattr(shutdown, "_in_forked_child", True)
    shutdown.install_in_pool_child()
    shutdown.install_in_pool_child()  # idempotent
    assert installed == [15]


SECRET = 'invalid input syntax for type json: "{\\"card\\": \\"4111\\"}"'


def test_a_tasks_exception_reaches_celery_as_its_class_and_sqlstate_only(caplog):
    class Orig(Exception):
        sqlstate = "22P02"

    @reported_without_messages
    def task(job_id: str) -> None:
        raise DataError("UPDATE jobs SET result = %(r)s", {"r": "4111"}, Orig(SECRET))

    with caplog.at_level(logging.ERROR, logger="spacejobs.tasks"), \
            pytest.raises(TaskFailed) as failed:
        task("j-1")
    text = str(failed.value)
    assert text == "sqlalchemy.exc.DataError (SQLSTATE 22P02 invalid_text_representation)"
    assert failed.value.__cause__ is None and failed.value.__suppress_context__
    assert "4111" not in caplog.records[0].getMessage()
    assert caplog.records[0].getMessage() == f"task task failed: {text}"


def test_a_task_that_succeeds_returns_what_it_returned_and_keeps_its_name():
    @reported_without_messages
    def wake(job_id: str | None = None) -> str:
        return f"woke {job_id}"

    assert wake(job_id="x") == "woke x" and wake.__name__ == "wake"
