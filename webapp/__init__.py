"""Flask app factory: the JSON API for users (ops and the HTML UI come as their own blueprints)."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import uuid
from typing import Any

from flask import Flask, g, has_request_context, request
from flask_limiter import Limiter

from models.counters import BufferedCounters
from models.db import APP_ROLE, OPERATOR_ROLE, make_engine, role_url
from models.kinds import load_kinds
from webapp import errors
from webapp.wakeups import WakeupPublisher

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

def _rate_key() -> str:
    """Per API token (hashed: the key is stored in Redis), else per client address.

    The limiter runs before the view, so it cannot wait for authentication to name the user.
    """
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return "token:" + hashlib.sha256(token.strip().encode()).hexdigest()[:32]
    return "addr:" + (request.remote_addr or "unknown")


limiter = Limiter(key_func=_rate_key)


def create_app(config: dict[str, Any] | None = None) -> Flask:
    """Build the app. ``config`` overrides environment defaults (tests pass URLs here)."""
    app = Flask(__name__)
    app.config.update(
        DATABASE_URL=os.environ.get("SPACEJOBS_APP_DATABASE_URL"),
        BROKER_URL=os.environ.get("REDIS_URL"),
        QUEUE=os.environ.get("SPACEJOBS_QUEUE"),
        DB_STATEMENT_TIMEOUT_MS=int(os.environ.get("SPACEJOBS_WEB_STATEMENT_TIMEOUT_MS", "5000")),
        EVENTS_POLL_SECONDS=float(os.environ.get("SPACEJOBS_EVENTS_POLL_SECONDS", "0.5")),
        EVENTS_MAX_SECONDS=float(os.environ.get("SPACEJOBS_EVENTS_MAX_SECONDS", "120")),
        POLL_RATE_LIMIT=os.environ.get("SPACEJOBS_POLL_RATE_LIMIT", "600 per minute"),
        RATELIMIT_STORAGE_URI=_limiter_storage(os.environ.get("REDIS_URL")),
        RATELIMIT_SWALLOW_ERRORS=True,
        RATELIMIT_HEADERS_ENABLED=True,
        RATELIMIT_KEY_PREFIX="spacejobs",
        MAX_CONTENT_LENGTH=1024 * 1024,
        OPERATOR_DATABASE_URL=os.environ.get("SPACEJOBS_OPERATOR_DATABASE_URL"),
        # Sessions only carry the dashboard login. Without a configured key every process
        # makes its own, so a login would not survive a restart or cross web processes.
        SECRET_KEY=os.environ.get("SPACEJOBS_SECRET_KEY") or secrets.token_hex(32),
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        JSON_SORT_KEYS=False,
    )
    if config:
        app.config.update(config)
        if "BROKER_URL" in config and "RATELIMIT_STORAGE_URI" not in config:
            app.config["RATELIMIT_STORAGE_URI"] = _limiter_storage(config["BROKER_URL"])

    load_kinds()
    app.extensions["spacejobs.db"] = make_engine(
        app.config["DATABASE_URL"] or role_url(APP_ROLE), pool_size=5, application_name="spacejobs-web",
        statement_timeout_ms=app.config["DB_STATEMENT_TIMEOUT_MS"],
    )
    app.extensions["spacejobs.operator_db"] = make_engine(
        app.config["OPERATOR_DATABASE_URL"] or role_url(OPERATOR_ROLE, app.config["DATABASE_URL"]),
        pool_size=2, application_name="spacejobs-ops")
    db = app.extensions["spacejobs.db"]
    app.extensions["spacejobs.wakeups"] = WakeupPublisher(
        app.config["BROKER_URL"], app.config["QUEUE"], counters=BufferedCounters(lambda: db))
    limiter.init_app(app)

    @app.before_request
    def assign_request_id() -> None:
        incoming = request.headers.get("X-Request-ID", "")
        g.request_id = incoming if _REQUEST_ID.match(incoming) else uuid.uuid4().hex

    @app.after_request
    def echo_request_id(response):  # type: ignore[no-untyped-def]
        response.headers["X-Request-ID"] = g.get("request_id", "")
        return response

    from webapp import ops, ui
    from webapp.api import api

    app.register_blueprint(api)
    app.register_blueprint(ops.bp)
    app.register_blueprint(ui.bp)
    _log_request_ids()
    errors.register(app)
    logging.getLogger("spacejobs").setLevel(logging.INFO)
    return app


class _RequestIdFilter(logging.Filter):
    """Every log line written while serving a request carries its request id."""

    def filter(self, record: logging.LogRecord) -> bool:
        if has_request_context() and not hasattr(record, "request_id"):
            record.request_id = g.get("request_id")
        return True


def _log_request_ids() -> None:
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _RequestIdFilter) for f in handler.filters):
            handler.addFilter(_RequestIdFilter())


def _limiter_storage(redis_url: str | None) -> str:
    """Rate-limit counters live in Redis so every web process shares them."""
    if not redis_url:
        return "memory://"
    if redis_url.startswith("redis+socket://"):
        return "redis+unix://" + redis_url[len("redis+socket://"):]
    return redis_url
