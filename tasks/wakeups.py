"""The one publisher of wake-ups, for the web and the workers alike.

It publishes by task NAME and imports no task bodies, so the web may use it without importing
the worker. A wake-up is only a nudge: it is sent after the job row is committed, and if the
broker is down the job is still durable and the sweeper re-sends the signal.

Wake-ups are coalesced: a worker drains every due job it can see, so one wake-up on its way is
enough for any number of submits. A submit publishes only when it sets the guard key
(``SET key NX PX``); a worker deletes the key (:meth:`WakeupPublisher.awake`) BEFORE its first
claim. So a job committed before that delete is seen by the claims that follow it, and a job
committed after it finds no key and publishes again: no job waits for a wake-up that will not
come. The key expires after ``SPACEJOBS_WAKEUP_COALESCE_MS`` in case its message is lost, and
the sweeper re-sends wake-ups for due jobs nobody claimed, as before.
"""

from __future__ import annotations

import logging
import time

import redis
from celery import Celery

from spacejobs.models.ops.counters import WAKEUPS_FAILED, WAKEUPS_PUBLISHED, BufferedCounters
from spacejobs.models.settings import get_settings

log = logging.getLogger("spacejobs.wakeups")

WAKE_TASK = "spacejobs.wake"
SWEEP_TASK = "spacejobs.sweep"


class WakeupPublisher:
    def __init__(self, broker_url: str | None = None, queue: str | None = None,
                 counters: BufferedCounters | None = None, *, celery: Celery | None = None) -> None:
        settings = get_settings()
        self._counters = counters
        self._backoff = settings.broker_backoff
        self._skip_until = 0.0
        if celery is None:
            celery = Celery("spacejobs-publisher", set_as_current=False)
            celery.config_from_object("spacejobs.celeryconfig")
            if broker_url:
                # celery-types makes conf.broker_url a read-only property; Celery's conf takes it.
                celery.conf.broker_url = broker_url  # type: ignore[misc]
            if queue:
                celery.conf.task_default_queue = queue
        self._celery = celery
        self._guard_key = guard_key(celery.conf.task_default_queue)
        self._guard_ms = settings.wakeup_coalesce_ms
        self._redis = redis.Redis.from_url(
            redis_py_url(celery.conf.broker_url), socket_timeout=settings.broker_timeout,
            socket_connect_timeout=settings.broker_timeout)

    def wake(self, job_id: str | None = None, *, countdown: float | None = None,
             force: bool = False) -> bool:
        """True if a wake-up is on its way (published now, or already pending); False (logged)
        if the broker did not take it. Never raises.

        ``force`` publishes even when one is pending (a retry's delayed wake-up, the sweeper's
        re-signals). After a failure, publishing is skipped for ``SPACEJOBS_BROKER_BACKOFF``
        seconds: each attempt against a dead broker costs a connect timeout, and the sweeper
        re-sends every skipped wake-up anyway, so submits stay fast while Redis is down.
        """
        if time.monotonic() < self._skip_until:
            self._count(WAKEUPS_FAILED)
            return False
        if self._skip_until and not self.reachable():
            # Still down after the back-off: a PING fails at once, where Celery's publish would
            # hold the caller (a web request, beat's loop) for its connection retry, ~2 s.
            self._count(WAKEUPS_FAILED)
            self._skip_until = time.monotonic() + self._backoff
            return False
        try:
            if not (force or countdown) and not self._redis.set(
                    self._guard_key, b"1", nx=True, px=self._guard_ms):
                self._skip_until = 0.0
                return True  # one is on its way and will see this job too
            self._celery.send_task(WAKE_TASK, kwargs={"job_id": job_id}, countdown=countdown,
                                   retry=False)
        except Exception as exc:
            self._count(WAKEUPS_FAILED)
            self._skip_until = time.monotonic() + self._backoff
            log.warning("wake-up not published (%s); the sweeper will re-send it",
                        type(exc).__name__, extra={"job_id": job_id})
            return False
        self._skip_until = 0.0
        self._count(WAKEUPS_PUBLISHED)
        return True

    def reachable(self) -> bool:
        """Whether the broker answers a PING now (within ``SPACEJOBS_BROKER_TIMEOUT``)."""
        try:
            return bool(self._redis.ping())
        except Exception:
            return False

    def awake(self) -> None:
        """A worker is about to claim: from now on a new submit must publish again."""
        try:
            self._redis.delete(self._guard_key)
        except Exception as exc:
            # The key expires by itself; until then submits rely on this drain and the sweeper.
            log.warning("wake-up guard not cleared (%s)", type(exc).__name__)

    def _count(self, name: str) -> None:
        if self._counters is not None:
            self._counters.add(name)


def guard_key(queue: str) -> str:
    """The Redis key that says a wake-up for ``queue`` is on its way (see the module's doc)."""
    return "spacejobs:wake-pending:" + queue


def redis_py_url(url: str) -> str:
    """redis-py spells kombu's unix-socket URL (the embedded Redis) ``unix://``."""
    if url.startswith("redis+socket://"):
        return "unix://" + url[len("redis+socket://"):]
    return url
