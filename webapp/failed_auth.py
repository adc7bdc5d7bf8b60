"""Failed authentications, counted per client address and across all addresses, so that a flood
of made-up credentials is refused 429 before it costs a lookup in PostgreSQL.

A request that presents a credential (an API token, or a session cookie that names a session)
costs a lookup. One that fails (an unknown or revoked token, a dead session) counts against its
client address (``FAILED_AUTH_RATE_LIMIT_ADDRESS``) and against everyone
(``FAILED_AUTH_RATE_LIMIT_GLOBAL``). Once a budget is spent, every request that presents a
credential, from that address or (the global one) from anywhere, is answered 429 with
``Retry-After`` before any lookup, on every URL alike, until the budget's window ends. The
per-address budget comes first, so one attacker is stopped long before the global one, which
is the backstop against a flood spread over many addresses (and, while spent, refuses the
credentials of everyone).

The counts are kept where the rate limits keep theirs (Redis, shared by every web process).
Whether a budget is spent is remembered by each process, from the failure that spent it or that
found it spent, so that a request with a good credential asks Redis nothing more; a budget
spent by one process therefore admits one more lookup in each other process.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from flask import Flask, current_app
from limits import parse
from limits.errors import StorageError

from models.errors import RateLimited
from webapp.limits import address_key

log = logging.getLogger("spacejobs.web")

#: the global budget's key beside the addresses' (which all begin with "addr:")
EVERYONE = "everyone"
#: each budget: its setting and the key it is counted under
_BUDGETS = (("FAILED_AUTH_RATE_LIMIT_ADDRESS", address_key),
            ("FAILED_AUTH_RATE_LIMIT_GLOBAL", lambda: EVERYONE))


class SpentBudgets:
    """The budgets this process knows to be spent, each with the moment (``time.time()``) its
    window ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}

    def mark(self, key: str, until: float) -> None:
        with self._lock:
            now = time.time()
            # Only spent budgets are kept, each until its window ends: a handful at a time.
            for stale in [k for k, end in self._until.items() if end <= now]:
                del self._until[stale]
            self._until[key] = max(until, self._until.get(key, 0.0))

    def seconds_left(self, *keys: str) -> float:
        """How long until every one of ``keys`` has budget again (0: it has now)."""
        now = time.time()
        with self._lock:
            return max(0.0, *(self._until.get(key, 0.0) - now for key in keys))


def install(app: Flask, presents_credential: Callable[[], bool]) -> None:
    """Refuse spent budgets before anything else looks a credential up: called before the
    blueprints are registered, so that this runs before the operators' 404 and the rate limits.
    ``presents_credential`` tells whether the request would be looked up (webapp.auth)."""
    spent = app.extensions["spacejobs.failed_auth"] = SpentBudgets()

    @app.before_request
    def refuse_when_spent() -> None:
        left = spent.seconds_left(address_key(), EVERYONE)
        if left and presents_credential():
            raise RateLimited("Too many failed authentications; wait, then try again.",
                              retry_after=max(1, math.ceil(left)))


def count_failure() -> None:
    """One failed authentication, against the client's address and against everyone. Never
    changes this request's answer (it is the same as before, on every URL): a budget it finds
    spent refuses the next requests."""
    strategy = current_app.extensions["spacejobs.limiter"].limiter
    spent: SpentBudgets = current_app.extensions["spacejobs.failed_auth"]
    for setting, key_of in _BUDGETS:
        item, key = parse(current_app.config[setting]), key_of()
        identifiers = ("spacejobs", "failed-auth", key)
        try:
            strategy.hit(item, *identifiers)
            if not strategy.test(item, *identifiers):
                spent.mark(key, strategy.get_window_stats(item, *identifiers).reset_time)
        except StorageError as error:
            # Not counted, whatever RATE_LIMIT_FAIL says: the answer must not depend on Redis
            # here (an /ops URL would then answer otherwise than an unknown one).
            log.warning("rate-limit storage unavailable, failed authentication not counted: %s",
                        type(error.storage_error).__name__)
            return
