"""Failed authentications, counted per client address and across all addresses, so that a flood
of made-up credentials is refused 429 before it costs a lookup in PostgreSQL.

A request that presents a credential (an API token, or a session cookie that names a session)
costs a lookup. One that fails (an unknown or revoked token, a dead session) counts against its
client address (``FAILED_AUTH_RATE_LIMIT_ADDRESS``) and against everyone
(``FAILED_AUTH_RATE_LIMIT_GLOBAL``). Once a budget is spent, every request that presents a
credential, from that address or (the global one) from anywhere, is answered 429 with
``Retry-After`` before any lookup, on every URL alike, until the budget's window ends. The
per-address budget comes first, so one attacker is stopped long before the global one, which
is the backstop against a flood spread over many addresses.

While only the global budget is spent, a credential this process accepted in the last
``KNOWN_GOOD_SECONDS`` still goes through (and is looked up as always, so a revocation still
takes effect at once): a flood from many addresses then holds back new sign-ins and new tokens,
not the members already working. Each process remembers at most ``KNOWN_GOOD_MAX`` of them, as
digests.

The counts are kept where the rate limits keep theirs (Redis, shared by every web process).
Whether a budget is spent is remembered by each process, from the failure that spent it or that
found it spent, so that a request with a good credential asks Redis nothing more; a budget
spent by one process therefore admits one more lookup in each other process.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from flask import Flask, current_app
from limits import parse
from limits.errors import StorageError

from spacejobs.models.errors import RateLimited
from spacejobs.webapp.limits import address_key

log = logging.getLogger("spacejobs.web")

#: the global budget's key beside the addresses' (which all begin with "addr:")
EVERYONE = "everyone"
#: each budget: its setting and the key it is counted under
_BUDGETS = (("FAILED_AUTH_RATE_LIMIT_ADDRESS", address_key),
            ("FAILED_AUTH_RATE_LIMIT_GLOBAL", lambda: EVERYONE))
#: how long an accepted credential passes a spent global budget, and how many a process keeps
KNOWN_GOOD_SECONDS = 900.0
KNOWN_GOOD_MAX = 10_000


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


class KnownGood:
    """Digests of the credentials this process accepted lately, oldest first, each with the
    moment (``time.monotonic()``) it stops counting."""

    def __init__(self, *, seconds: float = KNOWN_GOOD_SECONDS, most: int = KNOWN_GOOD_MAX) -> None:
        self._lock = threading.Lock()
        self._until: OrderedDict[bytes, float] = OrderedDict()
        self._seconds, self._most = seconds, most

    def add(self, digest: bytes) -> None:
        with self._lock:
            self._until.pop(digest, None)
            self._until[digest] = time.monotonic() + self._seconds
            while len(self._until) > self._most:
                self._until.popitem(last=False)

    def __contains__(self, digest: object) -> bool:
        with self._lock:
            until = self._until.get(digest)  # type: ignore[call-overload]
            return until is not None and until > time.monotonic()


def credential_digest(credential: str) -> bytes:
    return hashlib.sha256(credential.encode()).digest()


def install(app: Flask, credential: Callable[[], str | None]) -> None:
    """Refuse spent budgets before anything else looks a credential up: called before the
    blueprints are registered, so that this runs before the operators' 404 and the rate limits.
    ``credential`` gives what the request would be looked up by, None for nothing
    (webapp.auth.presented_credential)."""
    spent = app.extensions["spacejobs.failed_auth"] = SpentBudgets()
    known = app.extensions["spacejobs.known_good"] = KnownGood()

    @app.before_request
    def refuse_when_spent() -> None:
        left = spent.seconds_left(address_key(), EVERYONE)
        if not left:
            return  # the usual case: the session is not even read (no Vary: Cookie)
        presented = credential()
        if presented is None:
            return
        if not spent.seconds_left(address_key()) and credential_digest(presented) in known:
            return  # only the global budget is spent, and this credential was good lately
        raise RateLimited("Too many failed authentications; wait, then try again.",
                          retry_after=max(1, math.ceil(left)))


def count_success(credential: str) -> None:
    """The request's credential was accepted: it passes a spent global budget for a while."""
    current_app.extensions["spacejobs.known_good"].add(credential_digest(credential))


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
