"""Flask app factory: the JSON API, the pages for people (ui) and the operators' dashboard (ops)."""

from __future__ import annotations

import logging
import re
import secrets
import uuid
from datetime import timedelta
from typing import Any

from flask import Flask, g, has_request_context, request

from spacejobs.models import tracing
from spacejobs.models.db.engine import make_engine
from spacejobs.models.db.roles import APP_ROLE, OPERATOR_ROLE, role_url
from spacejobs.models.jobs.service import Jobs
from spacejobs.models.json_limits import MAX_BODY_BYTES
from spacejobs.models.kinds import load_kinds
from spacejobs.models.ops.counters import BufferedCounters
from spacejobs.models.results.configured import open_store
from spacejobs.models.settings import get_settings
from spacejobs.tasks.wakeups import WakeupPublisher
from spacejobs.webapp import errors, failed_auth, inputs, limits, ops, ui
from spacejobs.webapp.api import api
from spacejobs.webapp.auth import presented_credential
from spacejobs.webapp.limits import limiter_storage
from spacejobs.webapp.streams import StreamSlots

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

def create_app(config: dict[str, Any] | None = None) -> Flask:
    """Build the app and its wiring, once per web process: the engines, the wake-up publisher,
    the one job API, the results store. ``config`` overrides environment defaults (tests pass
    URLs here)."""
    settings = get_settings()
    app = Flask(__name__)
    app.config.update(
        DATABASE_URL=settings.app_database_url,
        BROKER_URL=settings.redis_url,
        QUEUE=settings.queue,
        DB_STATEMENT_TIMEOUT_MS=settings.web_statement_timeout_ms,
        EVENTS_POLL_SECONDS=settings.events_poll_seconds,
        EVENTS_MAX_SECONDS=settings.events_max_seconds,
        POLL_RATE_LIMIT=settings.poll_rate_limit,
        API_RATE_LIMIT=settings.api_rate_limit,
        SUBMIT_RATE_LIMIT=settings.submit_rate_limit,
        ORG_SUBMIT_RATE_LIMIT=settings.org_submit_rate_limit,
        RATE_LIMIT_FAIL=settings.rate_limit_fail,
        RATE_LIMIT_TIMEOUT=settings.rate_limit_timeout,
        EVENTS_STREAMS_PER_PROCESS=settings.events_streams_per_process,
        EVENTS_STREAMS_PER_ORGANIZATION=settings.events_streams_per_organization,
        EVENTS_STREAMS_PER_CREDENTIAL=settings.events_streams_per_credential,
        WORKER_OFFLINE_AFTER=settings.worker_offline_after,
        RATELIMIT_STORAGE_URI=limiter_storage(settings.redis_url),
        # No X-RateLimit-* headers on every answer: Flask-Limiter reads them with one more Redis
        # round trip per request (measured: 15% of a POST's time under wrk). A 429 still says
        # when to come back (Retry-After, webapp/limits.py).
        RATELIMIT_HEADERS_ENABLED=False,
        RATELIMIT_KEY_PREFIX="spacejobs",
        MAX_CONTENT_LENGTH=MAX_BODY_BYTES,  # a body, or a form with its file (models/json_limits.py)
        OPERATOR_DATABASE_URL=settings.operator_database_url,
        # Without a configured key every process makes its own, so a login would not survive
        # a restart or cross web processes.
        SECRET_KEY=(settings.secret_key.get_secret_value() if settings.secret_key
                    else secrets.token_hex(32)),
        # The cookie carries only the id of a server-side session (models.tenancy.sessions),
        # re-checked on every request; these bound what a stolen or forgotten cookie can do.
        SESSION_COOKIE_NAME="spacejobs_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=settings.session_cookie_secure,
        SESSION_IDLE_SECONDS=settings.session_idle_minutes * 60,
        PERMANENT_SESSION_LIFETIME=timedelta(hours=settings.session_max_hours),
        # The cookie is written when the session changes, not re-sent on every answer: the
        # server-side session ends PERMANENT_SESSION_LIFETIME after sign-in whatever the cookie
        # says, and an answer that never read the session (the 404 of an unknown URL, and so
        # the operators' 404 for everyone else) must carry no cookie, stamped with the time.
        SESSION_REFRESH_EACH_REQUEST=False,
        LOGIN_RATE_LIMIT_ACCOUNT=settings.login_rate_limit_account,
        LOGIN_RATE_LIMIT_ACCOUNT_GLOBAL=settings.login_rate_limit_account_global,
        LOGIN_RATE_LIMIT_ADDRESS=settings.login_rate_limit_address,
        FAILED_AUTH_RATE_LIMIT_ADDRESS=settings.failed_auth_rate_limit_address,
        FAILED_AUTH_RATE_LIMIT_GLOBAL=settings.failed_auth_rate_limit_global,
        JSON_SORT_KEYS=False,
    )
    if config:
        app.config.update(config)
        if "BROKER_URL" in config and "RATELIMIT_STORAGE_URI" not in config:
            app.config["RATELIMIT_STORAGE_URI"] = limiter_storage(config["BROKER_URL"])

    load_kinds()
    # Before the engines, whose statements are then traced too (models/trace_setup.py).
    if tracing.configure(settings, "spacejobs-web"):
        _instrument(app)
    # One connection kept per request thread (a request holds at most one at a time, and the
    # counters' flush thread waits its turn): with fewer, the extra connections a busy process
    # opens are closed as they come back, and every few requests fork a new backend
    # (docs/benchmarks.md, "The web's pool").
    app.extensions["spacejobs.db"] = make_engine(
        app.config["DATABASE_URL"] or role_url(APP_ROLE), pool_size=settings.web_threads,
        max_overflow=0, application_name="spacejobs-web",
        statement_timeout_ms=app.config["DB_STATEMENT_TIMEOUT_MS"],
    )
    app.extensions["spacejobs.operator_db"] = make_engine(
        app.config["OPERATOR_DATABASE_URL"] or role_url(OPERATOR_ROLE, app.config["DATABASE_URL"]),
        pool_size=2, application_name="spacejobs-ops")
    db = app.extensions["spacejobs.db"]
    # Of tasks/ the web imports only this publisher, which sends wake-ups by task NAME, and the
    # kind modules the settings name (load_kinds): never the Celery app or a task body. tasks/
    # never imports webapp/.
    wake = WakeupPublisher(app.config["BROKER_URL"], app.config["QUEUE"],
                           counters=BufferedCounters(lambda: db)).wake
    # The one job API of this process: the JSON API, the pages and the dashboard act through it.
    app.extensions["spacejobs.jobs"] = Jobs(db, wake=wake,
                                            operator_engine=app.extensions["spacejobs.operator_db"])
    # Tests pass a store of their own (RESULTS_STORE); otherwise the one the settings name.
    app.extensions["spacejobs.results"] = app.config.get("RESULTS_STORE") or open_store(settings)
    app.extensions["spacejobs.streams"] = StreamSlots(
        per_process=app.config["EVENTS_STREAMS_PER_PROCESS"],
        per_organization=app.config["EVENTS_STREAMS_PER_ORGANIZATION"],
        per_credential=app.config["EVENTS_STREAMS_PER_CREDENTIAL"])

    @app.before_request
    def assign_request_id() -> None:
        incoming = request.headers.get("X-Request-ID", "")
        g.request_id = incoming if _REQUEST_ID.match(incoming) else uuid.uuid4().hex

    @app.after_request
    def echo_request_id(response):  # type: ignore[no-untyped-def]
        response.headers["X-Request-ID"] = g.get("request_id", "")
        # What gunicorn's access log names the request by (webapp/cli.py ACCESS_LOG_FORMAT):
        # the route's template, never the URL, whose values (a signal's name, ids, a path no
        # route matched) are the client's own words.
        request.environ[ROUTE_ENVIRON_KEY] = request.url_rule.rule if request.url_rule else "-"
        if response.mimetype == "text/html":
            # Our pages load nothing from elsewhere and are never framed (no clickjacking of a
            # Cancel button); inline styles stay allowed, scripts come only from /static.
            response.headers["Content-Security-Policy"] = (
                "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
            response.headers["X-Content-Type-Options"] = "nosniff"
            response.headers["Referrer-Policy"] = "same-origin"
        return response

    inputs.install(app)
    failed_auth.install(app, presented_credential)
    app.register_blueprint(api)
    app.register_blueprint(ops.bp)
    app.register_blueprint(ui.bp)
    limits.configure(app)
    _log_request_ids()
    errors.register(app)
    logging.getLogger("spacejobs").setLevel(logging.INFO)
    return app


def _instrument(app: Flask) -> None:
    """A server span per request (its route's template, method and status: no URL values, no
    client address leave the process, models/trace_setup.py) and a span per wake-up published,
    whose context the worker's Celery task continues. Only when this process traces."""
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.flask import FlaskInstrumentor

    FlaskInstrumentor().instrument_app(app, excluded_urls="/static/.*")
    CeleryInstrumentor().instrument()


#: the WSGI environ key that holds the matched route's template for the access log
ROUTE_ENVIRON_KEY = "spacejobs.route"


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
