"""The waits chore (tasks/maintenance/waits.py) against PostgreSQL: a waiting job whose moment
has passed goes back to the queue and is woken, recorded as the sweeper's; one whose moment is
still to come, or that waits for a signal, stays waiting."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from spacejobs.tasks.maintenance.waits import Waits, WaitsReport
from tests.integration.maintenance_kit import Publisher, as_beat, status_of, waiting
from tests.kit.stack import Stack


def test_a_waiting_job_whose_moment_passed_is_queued_and_woken_and_the_others_wait(
        bare_stack: Stack):
    stack = bare_stack
    now = datetime.now(UTC)
    due = waiting(stack, until=now - timedelta(seconds=1))
    later = waiting(stack, until=now + timedelta(hours=1))
    signal = waiting(stack, signal="approve")
    publisher = Publisher()
    report = Waits(5).run(as_beat(stack, publisher))
    assert report == WaitsReport(resumed=1, wakeups_sent=1)
    assert publisher.woken == [str(due.id)]
    assert [status_of(stack, j.id) for j in (due, later, signal)] == [
        "queued", "waiting", "waiting"]
    assert [(e["from_status"], e["actor"]) for e in stack.events(due.id)][-1] == (
        "waiting", "sweeper")
    assert Waits(5).run(as_beat(stack)) == WaitsReport()
