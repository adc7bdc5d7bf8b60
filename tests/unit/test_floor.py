"""The floor under the broker's wake-ups (tasks/floor.py), through fakes: when a pool process
drains by itself, and that it never runs two drains at once."""

from __future__ import annotations

import threading

from spacejobs.tasks.engine.floor import Drains, Floor


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def floor(drains: Drains, broker: list[bool], ran: list[str], *, idle_poll: float = 10) -> Floor:
    def drain() -> int:
        ran.append("drain")
        return 1

    return Floor(drains, drain, broker_reachable=lambda: broker[0], stopping=lambda: False,
                 interval=1, idle_poll=idle_poll)


def test_with_the_broker_unreachable_every_round_drains():
    clock, ran, broker = Clock(), [], [False]
    looking = floor(Drains(clock), broker, ran)
    assert looking.round() == 1 and looking.round() == 1
    assert ran == ["drain", "drain"] and looking.degraded


def test_with_the_broker_back_it_drains_only_after_the_idle_poll(caplog):
    clock, ran, broker = Clock(), [], [False]
    drains = Drains(clock)
    looking = floor(drains, broker, ran, idle_poll=10)
    looking.round()
    broker[0] = True
    clock.now += 3
    assert looking.round() is None and not looking.degraded
    clock.now += 7
    assert looking.round() == 1
    assert ran == ["drain", "drain"]
    said = [r.getMessage() for r in caplog.records if r.name == "spacejobs.floor"]
    assert said == ["broker unreachable: this process claims from PostgreSQL alone",
                    "broker reachable again: back to its wake-ups"]


def test_an_idle_poll_of_zero_never_drains_while_the_broker_answers():
    ran: list[str] = []
    looking = floor(Drains(Clock()), [True], ran, idle_poll=0)
    assert looking.round() is None and ran == []


def test_a_process_never_runs_two_drains_at_once():
    drains = Drains()
    inside, release = threading.Event(), threading.Event()

    def long_drain() -> int:
        inside.set()
        release.wait(5)
        return 7

    first = threading.Thread(target=drains.run, args=(long_drain,))
    first.start()
    inside.wait(5)
    # The floor does not wait: it skips its round while a wake-up's drain runs.
    assert drains.run(lambda: 1, wait=False) is None
    # A wake-up waits for the floor's drain, then runs its own.
    waited: list[int | None] = []
    second = threading.Thread(target=lambda: waited.append(drains.run(lambda: 2)))
    second.start()
    assert second.is_alive()
    release.set()
    first.join(5)
    second.join(5)
    assert waited == [2]


def test_idle_for_counts_from_the_end_of_the_last_drain():
    clock = Clock()
    drains = Drains(clock)
    assert drains.idle_for() == float("inf")
    drains.run(lambda: 0)
    clock.now += 4
    assert drains.idle_for() == 4
