"""A worker's graceful shutdown (tasks/shutdown.py) with a clock the test moves, and a task's
failure as Celery is told of it (tasks/task_failures.py)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from sqlalchemy.exc import DataError

from spacejobs.tasks import shutdown
from spacejobs.tasks.task_failures import TaskFailed, reported_without_messages


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_before_a_stop_nothing_is_released(clock):
    stopping = shutdown.Shutdown(grace=20.0, clock=clock)
    assert not stopping.stop_requested() and not stopping.release_due()
    clock.now += 10_000
    assert not stopping.release_due()


def test_running_jobs_go_on_for_the_grace_and_are_given_back_after_it(clock):
    stopping = shutdown.Shutdown(grace=20.0, clock=clock)
    stopping.request_stop()
    assert stopping.stop_requested() and not stopping.release_due()
    clock.now += 19.9
    assert not stopping.release_due()
    clock.now += 0.1
    assert stopping.release_due()


def test_a_second_sigterm_does_not_extend_the_grace(clock):
    stopping = shutdown.Shutdown(grace=20.0, clock=clock)
    stopping.request_stop()
    clock.now += 15
    stopping.request_stop()
    clock.now += 5
    assert stopping.release_due()


def test_no_grace_gives_jobs_back_at_once(clock):
    stopping = shutdown.Shutdown(grace=0.0, clock=clock)
    stopping.request_stop()
    assert stopping.release_due()


def test_a_pool_child_takes_over_sigterm_once_and_a_sigterm_then_stops_its_claims(monkeypatch, clock):
    installed: dict[int, object] = {}
    monkeypatch.setattr(shutdown, "signal", SimpleNamespace(
        SIGTERM=15, signal=lambda signum, handler: installed.setdefault(signum, handler)))
    stopping = shutdown.Shutdown(grace=20.0, clock=clock)
    stopping.install_in_pool_child()
    stopping.install_in_pool_child()  # idempotent
    assert list(installed) == [15]
    installed[15](15, None)  # the signal arrives
    assert stopping.stop_requested() and not stopping.release_due()


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


def test_a_pool_child_ignores_sigterm_through_billiards_reset_until_it_takes_it_over():
    """Billiard replaces a pool child's SIGTERM handler with one that exits, after Celery's
    process init, unless the signal is ignored: the child ignores it until its main thread
    installs ours (a job the floor's thread runs must not die with the process)."""
    import signal as signals

    from billiard.common import reset_signals

    saved = saved_term_signals()
    try:
        stopping = shutdown.Shutdown(grace=20.0)
        stopping.ignore_until_installed()
        reset_signals()  # what billiard does once the initializer has run
        assert signals.getsignal(signals.SIGTERM) is signals.SIG_IGN
        stopping.install_in_pool_child()
        handler = signals.getsignal(signals.SIGTERM)
        assert callable(handler)
        handler(signals.SIGTERM, None)
        assert stopping.stop_requested() and not stopping.release_due()
        stopping.ignore_until_installed()  # once ours, it stays ours
        assert signals.getsignal(signals.SIGTERM) is handler
    finally:
        restore(saved)


def test_without_the_ignore_billiard_would_install_its_exiting_handler():
    import signal as signals

    from billiard.common import _shutdown_cleanup, reset_signals

    saved = saved_term_signals()
    try:
        signals.signal(signals.SIGTERM, lambda *_: None)  # a handler of ours, set too early
        reset_signals()
        assert signals.getsignal(signals.SIGTERM) is _shutdown_cleanup
    finally:
        restore(saved)


def saved_term_signals() -> dict:
    """billiard's reset_signals() changes every terminating signal of the test's process."""
    import signal as signals

    from billiard.common import TERMSIGS_DEFAULT

    found = {getattr(signals, name) for name in TERMSIGS_DEFAULT if hasattr(signals, name)}
    return {number: signals.getsignal(number) for number in found | {signals.SIGTERM}}


def restore(saved: dict) -> None:
    import signal as signals

    for number, handler in saved.items():
        signals.signal(number, handler if handler is not None else signals.SIG_DFL)
