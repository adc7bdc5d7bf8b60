"""The wake-up publisher (tasks/wakeups.py) against a fake broker and a fake Redis: one wake-up
on its way stands for every submit until a worker says it is awake, and a broker that failed is
left alone for a while (the sweeper re-sends)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from spacejobs.models.ops.counters import WAKEUPS_FAILED, WAKEUPS_PUBLISHED
from spacejobs.models.settings import get_settings
from spacejobs.tasks import wakeups
from spacejobs.tasks.wakeups import WAKE_TASK, WakeupPublisher, guard_key, redis_py_url


class FakeRedis:
    def __init__(self) -> None:
        self.keys: dict[str, tuple[bytes, int]] = {}
        self.down = False
        self.pings = 0

    def set(self, key, value, *, nx, px):
        if self.down:
            raise ConnectionError("redis is down")
        assert nx
        if key in self.keys:
            return None
        self.keys[key] = (value, px)
        return True

    def delete(self, key):
        if self.down:
            raise ConnectionError("redis is down")
        self.keys.pop(key, None)

    def ping(self):
        self.pings += 1
        if self.down:
            raise ConnectionError("redis is down")
        return True


class FakeCelery:
    def __init__(self) -> None:
        self.conf = SimpleNamespace(task_default_queue="q-unit", broker_url="redis://fake:1/0")
        self.sent: list[tuple[str, dict, float | None]] = []
        self.down = False

    def send_task(self, name, *, kwargs, countdown, retry):
        assert retry is False  # never a retry loop inside a submit
        if self.down:
            raise OSError("broker is down")
        self.sent.append((name, kwargs, countdown))


class Counted:
    def __init__(self) -> None:
        self.names: list[str] = []

    def add(self, name: str) -> None:
        self.names.append(name)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [500.0]
    monkeypatch.setattr(wakeups, "time", SimpleNamespace(monotonic=lambda: now[0]))
    return now


@pytest.fixture
def parts(clock):
    celery, redis, counters = FakeCelery(), FakeRedis(), Counted()
    publisher = WakeupPublisher(celery=celery, counters=counters)
    publisher._redis = redis
    return SimpleNamespace(publisher=publisher, celery=celery, redis=redis, counters=counters)


def test_a_wakeup_on_its_way_stands_for_every_later_submit(parts):
    assert all(parts.publisher.wake(f"job-{n}") for n in range(5))
    assert parts.celery.sent == [(WAKE_TASK, {"job_id": "job-0"}, None)]
    assert parts.counters.names == [WAKEUPS_PUBLISHED]
    _value, expires_ms = parts.redis.keys[guard_key("q-unit")]
    assert expires_ms == get_settings().wakeup_coalesce_ms  # a lost message is not waited for


def test_once_a_worker_is_awake_the_next_submit_publishes_again(parts):
    parts.publisher.wake("a")
    parts.publisher.awake()
    parts.publisher.wake("b")
    assert [kwargs["job_id"] for _, kwargs, _ in parts.celery.sent] == ["a", "b"]


def test_forced_and_delayed_wakeups_are_published_whatever_is_pending(parts):
    parts.publisher.wake("first")
    assert parts.publisher.wake("swept", force=True)
    assert parts.publisher.wake("retry", countdown=4.5)
    assert [(kwargs["job_id"], countdown) for _, kwargs, countdown in parts.celery.sent] == [
        ("first", None), ("swept", None), ("retry", 4.5)]


def test_a_failed_publish_is_counted_and_later_ones_are_skipped_for_the_backoff(parts, clock, caplog):
    parts.celery.down = True
    with caplog.at_level(logging.WARNING, logger="spacejobs.wakeups"):
        assert parts.publisher.wake("lost") is False
    assert "sweeper will re-send" in caplog.text and "broker is down" not in caplog.text
    parts.celery.down = False
    parts.redis.keys.clear()
    clock[0] += get_settings().broker_backoff - 0.1
    assert parts.publisher.wake("skipped") is False  # not even tried
    assert parts.celery.sent == []
    clock[0] += 0.2
    assert parts.publisher.wake("back") is True
    assert parts.counters.names == [WAKEUPS_FAILED, WAKEUPS_FAILED, WAKEUPS_PUBLISHED]


def test_after_the_backoff_a_broker_still_down_is_found_by_a_ping_not_a_publish(parts, clock):
    """Celery's publish to a dead broker holds its caller for a connection retry (~2 s): after
    a failure, a PING tells first, at once."""
    parts.celery.down = parts.redis.down = True
    assert parts.publisher.wake("lost") is False
    clock[0] += get_settings().broker_backoff + 0.1
    sent_before = len(parts.celery.sent)
    assert parts.publisher.wake("still down") is False
    assert parts.redis.pings == 1 and len(parts.celery.sent) == sent_before
    assert parts.publisher.wake("backing off again") is False  # within the new back-off
    assert parts.redis.pings == 1
    parts.celery.down = parts.redis.down = False
    clock[0] += get_settings().broker_backoff + 0.1
    assert parts.publisher.wake("back") is True
    assert parts.publisher.wake("x", force=True) is True
    assert parts.redis.pings == 2  # once published, no PING before each publish


def test_a_guard_that_cannot_be_set_is_a_failed_publish_too(parts):
    parts.redis.down = True
    assert parts.publisher.wake("x") is False
    assert parts.celery.sent == [] and parts.counters.names == [WAKEUPS_FAILED]


def test_a_guard_that_cannot_be_cleared_is_logged_and_left_to_expire(parts, caplog):
    parts.redis.down = True
    with caplog.at_level(logging.WARNING, logger="spacejobs.wakeups"):
        parts.publisher.awake()  # never raises into the worker's drain
    assert "wake-up guard not cleared (ConnectionError)" in caplog.text


def test_without_counters_a_publish_still_works(clock):
    celery = FakeCelery()
    publisher = WakeupPublisher(celery=celery)
    publisher._redis = FakeRedis()
    assert publisher.wake("x") and len(celery.sent) == 1


def test_each_queue_has_its_own_guard():
    assert guard_key("eu") != guard_key("us") and guard_key("eu").endswith(":eu")


@pytest.mark.parametrize(("url", "redis_py"), [
    ("redis+socket:///tmp/r.sock", "unix:///tmp/r.sock"),
    ("redis://:pw@h:6379/0", "redis://:pw@h:6379/0"),
    ("rediss://h:6380/1", "rediss://h:6380/1"),
])
def test_kombus_socket_url_is_spelt_as_redis_py_spells_it(url, redis_py):
    assert redis_py_url(url) == redis_py
