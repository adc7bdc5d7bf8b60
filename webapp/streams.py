"""Open events streams, counted so that they never take every thread of a web process.

An events stream holds one request thread for as long as it is open (up to
``SPACEJOBS_EVENTS_MAX_SECONDS``), and ``spacejobs web`` serves each process with a fixed pool
of threads (gunicorn gthread, ``SPACEJOBS_WEB_THREADS``). Uncounted, one member opening 40
streams would leave nobody else a thread. So each process admits at most
``EVENTS_STREAMS_PER_PROCESS`` streams (a share of its threads, well below all of them), and
of those at most ``EVENTS_STREAMS_PER_ORGANIZATION`` for one organization and
``EVENTS_STREAMS_PER_CREDENTIAL`` for one API token or web session. Past a cap the answer is
429 ``too_many_streams`` with ``Retry-After``: a client polls meanwhile, and the live job
page reloads itself as it does without JavaScript.

The counts are per process, as the threads they protect are.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from uuid import UUID

from spacejobs.models.errors import DomainError


class TooManyStreams(DomainError):
    code = "too_many_streams"
    message = "Too many open event streams; poll the job instead, or try again later."
    #: seconds before trying again: streams end by themselves within a few minutes at most
    retry_after = 10


class StreamSlots:
    """The open streams of this process, by organization and by credential."""

    def __init__(self, *, per_process: int, per_organization: int, per_credential: int) -> None:
        self.per_process = per_process
        self.per_organization = per_organization
        self.per_credential = per_credential
        self._lock = threading.Lock()
        self._open = 0
        self._by_organization: Counter[UUID] = Counter()
        self._by_credential: Counter[str] = Counter()

    def take(self, organization_id: UUID, credential: str) -> Callable[[], None]:
        """A slot for one stream, or TooManyStreams. Returns the release (safe to call twice)."""
        with self._lock:
            if (self._open >= self.per_process
                    or self._by_organization[organization_id] >= self.per_organization
                    or self._by_credential[credential] >= self.per_credential):
                raise TooManyStreams(retry_after=TooManyStreams.retry_after)
            self._open += 1
            self._by_organization[organization_id] += 1
            self._by_credential[credential] += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                self._open -= 1
                self._by_organization[organization_id] -= 1
                self._by_credential[credential] -= 1
                if not self._by_organization[organization_id]:
                    del self._by_organization[organization_id]
                if not self._by_credential[credential]:
                    del self._by_credential[credential]

        return release

    @property
    def open(self) -> int:
        return self._open
