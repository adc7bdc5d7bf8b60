"""Rate limits (Flask-Limiter), shared across web processes through Redis."""

from __future__ import annotations

import hashlib

from flask import request
from flask_limiter import Limiter


def rate_key() -> str:
    """Per API token (hashed: the key is stored in Redis), else per client address.

    The limiter runs before the view, so it cannot wait for authentication to name the user.
    """
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return "token:" + hashlib.sha256(token.strip().encode()).hexdigest()[:32]
    return address_key()


def address_key() -> str:
    return "addr:" + (request.remote_addr or "unknown")


def login_account_key() -> str:
    """Sign-in attempts per account: the email as typed, normalised and hashed (a Redis key
    should not hold an address)."""
    email = request.form.get("email", "").strip().lower()
    return "login:" + hashlib.sha256(email.encode()).hexdigest()[:32]


limiter = Limiter(key_func=rate_key)


def limiter_storage(redis_url: str | None) -> str:
    """Rate-limit counters live in Redis so every web process shares them."""
    if not redis_url:
        return "memory://"
    if redis_url.startswith("redis+socket://"):
        return "redis+unix://" + redis_url[len("redis+socket://"):]
    return redis_url
