"""Rate limits (Flask-Limiter), shared across web processes through Redis.

Every request that costs work is counted per credential (a hash of the API token, else of the
web session, else the client address): the JSON API's reads and writes (``API_RATE_LIMIT``),
job polling (``POLL_RATE_LIMIT``), submits (``SUBMIT_RATE_LIMIT``, and per organization
``ORG_SUBMIT_RATE_LIMIT`` once the member is known) and the operators' JSON API. A credential
is counted before it is checked, so a made-up token would get a budget of its own each time:
failed authentications are counted per client address and across all of them
(webapp/failed_auth.py), which refuses the flood before its lookups.

Redis can fail; no request waits on it for long. Its client gives up after
``RATE_LIMIT_TIMEOUT`` seconds (connect and read, no retries), and then ``RATE_LIMIT_FAIL``
decides: ``open`` (the default) serves the request, with each web process counting in its own
memory until Redis answers again (Flask-Limiter's in-memory fallback, which re-tries Redis at
growing intervals); ``closed`` answers 503 ``unavailable`` with ``Retry-After``.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar
from uuid import UUID

from flask import Flask, current_app, g, request, session
from flask_limiter import Limiter, RequestLimit
from limits import parse
from limits.errors import StorageError
from redis.backoff import NoBackoff
from redis.retry import Retry

from spacejobs.models.errors import RateLimited, Unavailable
from spacejobs.webapp.errors import UNAVAILABLE_RETRY_AFTER

log = logging.getLogger("spacejobs.web")

ViewT = TypeVar("ViewT", bound=Callable[..., Any])


def rate_key() -> str:
    """Per API token (hashed: the key is stored in Redis), else per web session, else per
    client address.

    The limiter runs before the view, so it cannot wait for authentication to name the user;
    the tokens that then fail are counted by webapp/failed_auth.py, per address.
    """
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return "token:" + _digest(token.strip())
    sid = session.get("sid")
    if isinstance(sid, str) and sid:
        return "session:" + _digest(sid)
    return address_key()


def address_key() -> str:
    """The client's address; for IPv6, its /64: a subscriber is given at least that block, and
    each of its 2**64 addresses is theirs to pick, so counting each apart would give one client
    that many budgets."""
    raw = request.remote_addr or "unknown"
    try:
        address = ipaddress.ip_address(raw)
    except ValueError:  # not an IP address (a unix socket's peer): as it comes
        return "addr:" + raw
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return "addr:" + str(address.ipv4_mapped)
        return "addr:" + str(ipaddress.IPv6Network((address, 64), strict=False))
    return "addr:" + str(address)


def login_account_global_key() -> str:
    """Sign-in attempts per account, from every client address: the email as typed, normalised
    and hashed (a Redis key should not hold an email address)."""
    email = request.form.get("email", "").strip().lower()
    return "login:" + _digest(email)


def login_account_key() -> str:
    """Sign-in attempts per account from this client address: the email is the attacker's to
    choose, so a limit on it alone would let one address lock its owner out everywhere."""
    return login_account_global_key() + ":" + address_key()


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:32]


def _config(name: str) -> Callable[[], str]:
    return lambda: current_app.config[name]


def limited(setting: str, *, shared: str | None = None, **options: Any
            ) -> Callable[[ViewT], ViewT]:
    """Mark a view as limited by the app's ``config[setting]`` (``shared``: one budget across
    every view marked with the same name); ``options`` go to Flask-Limiter's ``limit``.

    Only a mark: :func:`configure` gives each app its own Flask-Limiter (its storage, timeouts
    and failure rule are the app's) and wraps the marked views with it.
    """

    def mark(view: ViewT) -> ViewT:
        view.__dict__.setdefault("spacejobs_limits", []).append((setting, shared, options))
        return view

    return mark


#: every JSON API request but polling and submits, and the operators' JSON API: one budget
#: per credential
api_limit = limited("API_RATE_LIMIT", shared="api")
poll_limit = limited("POLL_RATE_LIMIT")
submit_limit = limited("SUBMIT_RATE_LIMIT", shared="submit")


def limiter_storage(redis_url: str | None) -> str:
    """Rate-limit counters live in Redis so every web process shares them."""
    if not redis_url:
        return "memory://"
    if redis_url.startswith("redis+socket://"):
        return "redis+unix://" + redis_url[len("redis+socket://"):]
    return redis_url


def configure(app: Flask) -> None:
    """Give the app its Flask-Limiter: every Redis call bounded, the failure rule chosen, and
    the views marked with :func:`limited` wrapped. Called after every blueprint is registered,
    so that its before-request hook runs after theirs (the operators' 404 for everyone else
    comes first)."""
    timeout = float(app.config["RATE_LIMIT_TIMEOUT"])
    fail_open = app.config["RATE_LIMIT_FAIL"] == "open"
    storage_options: dict[str, Any] = {}
    if app.config["RATELIMIT_STORAGE_URI"].startswith("redis"):
        storage_options = {
            "socket_connect_timeout": timeout, "socket_timeout": timeout,
            # redis-py retries a failed command 3 times with backoff by default: each retry
            # would be another wait for a Redis that is not answering.
            "retry": Retry(NoBackoff(), 0), "wrap_exceptions": True,
        }
    limiter = Limiter(key_func=rate_key, storage_options=storage_options,
                      swallow_errors=fail_open, in_memory_fallback_enabled=fail_open,
                      on_breach=_note_retry_after)
    limiter.init_app(app)
    app.extensions["spacejobs.limiter"] = limiter
    for endpoint, view in list(app.view_functions.items()):
        # Any: a view may be sync or async, and the limiter's decorator keeps whichever it wraps.
        wrapped: Callable[..., Any] = view
        for setting, shared, options in getattr(view, "spacejobs_limits", ()):
            provider = _config(setting)
            decorate = (limiter.shared_limit(provider, scope=shared, **options) if shared
                        else limiter.limit(provider, **options))
            wrapped = decorate(wrapped)
        app.view_functions[endpoint] = wrapped


def retry_after(limit: RequestLimit) -> int:
    """Seconds until the breached limit's window ends, for a 429's Retry-After."""
    try:
        wait = limit.reset_at - time.time()
    except Exception:  # the storage failed between the hit and this read: a whole window
        wait = limit.limit.get_expiry()
    return max(1, int(wait))


def _note_retry_after(limit: RequestLimit) -> None:
    """Every breach: its Retry-After, for the 429 webapp/errors.py answers (the per-response
    rate-limit headers, which would carry it, are off)."""
    g.rate_limit_retry_after = retry_after(limit)


def check_organization_submits(organization_id: UUID) -> None:
    """Count a submit against the organization's budget. Called once the requester is known
    to be a member, so a stranger cannot spend an organization's submits."""
    item = parse(current_app.config["ORG_SUBMIT_RATE_LIMIT"])
    key = ("spacejobs", "org-submit", str(organization_id))
    # the in-memory fallback while Redis is known to be down (fail open)
    strategy = current_app.extensions["spacejobs.limiter"].limiter
    try:
        if strategy.hit(item, *key):
            return
        reset_at = strategy.get_window_stats(item, *key).reset_time
    except StorageError as error:
        if current_app.config["RATE_LIMIT_FAIL"] == "open":
            log.warning("rate-limit storage unavailable, organization limit skipped: %s",
                        type(error.storage_error).__name__)
            return
        raise Unavailable(retry_after=UNAVAILABLE_RETRY_AFTER) from None
    raise RateLimited("Too many submits for this organization; slow down.",
                      retry_after=max(1, int(reset_at - time.time())))
