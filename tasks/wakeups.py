"""The one publisher of wake-ups, for the web and the workers alike.

It publishes by task NAME and imports no task bodies, so the web may use it without importing
the worker. A wake-up is only a nudge: it is sent after the job row is committed, and if the
broker is down the job is still durable and the sweeper re-sends the signal.
"""

from __future__ import annotations

import logging
import time

from celery import Celery

from models.ops.counters import WAKEUPS_FAILED, WAKEUPS_PUBLISHED, BufferedCounters
from models.settings import get_settings

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
            celery.config_from_object("celeryconfig")
            if broker_url:
                celery.conf.broker_url = broker_url
            if queue:
                celery.conf.task_default_queue = queue
        self._celery = celery

    def wake(self, job_id: str | None = None, *, countdown: float | None = None) -> bool:
        """True if the broker took the signal; False (logged) if not. Never raises.

        After a failure, publishing is skipped for ``SPACEJOBS_BROKER_BACKOFF`` seconds: each
        attempt against a dead broker costs a connect timeout, and the sweeper re-sends every
        skipped wake-up anyway, so submits stay fast while Redis is down.
        """
        if time.monotonic() < self._skip_until:
            self._count(WAKEUPS_FAILED)
            return False
        try:
            self._celery.send_task(WAKE_TASK, kwargs={"job_id": job_id}, countdown=countdown,
                                   retry=False)
        except Exception as exc:
            self._count(WAKEUPS_FAILED)
            self._skip_until = time.monotonic() + self._backoff
            log.warning("wake-up not published (%s); the sweeper will re-send it",
                        type(exc).__name__, extra={"job_id": job_id})
            return False
        self._count(WAKEUPS_PUBLISHED)
        return True

    def _count(self, name: str) -> None:
        if self._counters is not None:
            self._counters.add(name)
