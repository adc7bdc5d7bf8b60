"""Publishing wake-ups from the web, by task NAME: the web never imports task bodies.

A wake-up is only ever sent after the job row is committed; if the broker is down the job is
still durable and the sweeper re-sends the signal.
"""

from __future__ import annotations

import logging
import os
import time

from celery import Celery

from models.counters import WAKEUPS_FAILED, WAKEUPS_PUBLISHED, BufferedCounters

log = logging.getLogger("spacejobs.web")

WAKE_TASK = "spacejobs.wake"


class WakeupPublisher:
    def __init__(self, broker_url: str | None = None, queue: str | None = None,
                 counters: BufferedCounters | None = None) -> None:
        self._counters = counters
        self._backoff = float(os.environ.get("SPACEJOBS_BROKER_BACKOFF", "5"))
        self._skip_until = 0.0
        self._celery = Celery("spacejobs-web", set_as_current=False)
        self._celery.config_from_object("celeryconfig")
        if broker_url:
            self._celery.conf.broker_url = broker_url
        if queue:
            self._celery.conf.task_default_queue = queue

    def wake(self, job_id: str) -> bool:
        """True if the broker took the signal; False (logged) if not. Never raises.

        After a failure, publishing is skipped for ``SPACEJOBS_BROKER_BACKOFF`` seconds: each
        attempt against a dead broker costs a connect timeout, and the sweeper re-sends every
        skipped wake-up anyway. Submits stay fast while Redis is down.
        """
        if time.monotonic() < self._skip_until:
            self._count(WAKEUPS_FAILED)
            return False
        try:
            self._celery.send_task(WAKE_TASK, kwargs={"job_id": job_id}, retry=False)
            self._count(WAKEUPS_PUBLISHED)
            return True
        except Exception as exc:
            self._count(WAKEUPS_FAILED)
            self._skip_until = time.monotonic() + self._backoff
            log.warning("wake-up not published (%s); the sweeper will re-send it",
                        type(exc).__name__, extra={"job_id": job_id})
            return False

    def _count(self, name: str) -> None:
        if self._counters is not None:
            self._counters.add(name)
