"""Domain errors → HTTP, in one place. Bodies are ``{"error": {"code": ..., "message": ...}}``."""

from __future__ import annotations

import logging

from flask import Flask, Response, g, jsonify, make_response, render_template, request
from flask.typing import ResponseReturnValue
from limits.errors import StorageError
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from werkzeug.exceptions import HTTPException

from spacejobs.models.diagnostics import diagnose
from spacejobs.models.errors import DomainError, Unavailable

log = logging.getLogger("spacejobs.web")

#: seconds a client should wait when a server of ours (the database, the rate-limit counters)
#: is unavailable
UNAVAILABLE_RETRY_AFTER = 5

HTTP_STATUS = {
    "invalid_request": 400,
    "invalid_params": 400,
    "unknown_kind": 400,
    "unauthorized": 401,
    "insufficient_role": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "organization_unavailable": 409,
    "organization_read_only": 409,
    "duplicate_job": 409,
    "idempotency_key_reused": 409,
    "job_not_completed": 409,
    "job_finished": 409,
    "too_many_signals": 409,
    "no_step_waits": 409,
    "job_not_resumable": 409,
    "already_resumed": 409,
    "requester_not_member": 409,
    "result_expired": 410,
    "result_missing": 410,
    "payload_too_large": 413,
    "too_many_jobs": 429,
    "too_many_streams": 429,
    "rate_limited": 429,
    "internal_error": 500,
    "unavailable": 503,
}

# Details that may be echoed to the caller (ids of the caller's own organization, field names,
# why a field was refused: models.kinds.reasons, never the value).
_PUBLIC_DETAILS = ("job_id", "fields", "reasons", "status", "index", "step", "limit")


def wants_html() -> bool:
    """A browser asking for a page gets the error as a page; everyone else gets JSON. Decided by
    the Accept header alone, never by the path, so an /ops URL and a URL that does not exist
    still answer a non-operator byte for byte the same."""
    return request.accept_mimetypes.best_match(["application/json", "text/html"]) == "text/html"


def error_response(code: str, message: str, http_status: int, /, **extra: object) -> tuple[Response, int]:
    if wants_html():
        # No per-user navigation here: a removed member and a stranger see the same page. The
        # request id is shown only where support may need it (our own failures).
        page = render_template("error.html", code=code, message=message, status=http_status,
                               request_id=g.get("request_id") if http_status >= 500 else None)
        return make_response(page), http_status
    body: dict[str, object] = {"code": code, "message": message}
    body.update({k: v for k, v in extra.items() if v is not None})
    return jsonify({"error": body}), http_status


def register(app: Flask) -> None:
    @app.errorhandler(DomainError)
    def domain_error(error: DomainError) -> ResponseReturnValue:
        extra = {k: error.details.get(k) for k in _PUBLIC_DETAILS}
        response = error_response(error.code, error.message, HTTP_STATUS.get(error.code, 400), **extra)
        body, status = response
        if error.code == "unauthorized":
            return body, status, {"WWW-Authenticate": 'Bearer realm="spacejobs"'}
        if "retry_after" in error.details:
            return body, status, {"Retry-After": str(error.details["retry_after"])}
        return response

    @app.errorhandler(StorageError)
    def counters_unavailable(error: StorageError) -> ResponseReturnValue:
        # Only when rate limits fail closed (webapp.limits): the request is refused, not served.
        log.error("rate-limit storage unavailable: %s", type(error.storage_error).__name__)
        return domain_error(Unavailable(retry_after=UNAVAILABLE_RETRY_AFTER))

    @app.errorhandler(OperationalError)
    @app.errorhandler(PoolTimeout)
    def database_unavailable(error: Exception) -> ResponseReturnValue:
        # No message: a driver's can name hosts, users, SQL or the data it refused.
        log.error("database unavailable: %s", diagnose(error).summary)
        return domain_error(Unavailable(retry_after=UNAVAILABLE_RETRY_AFTER))

    @app.errorhandler(DBAPIError)
    def database_error(error: DBAPIError) -> ResponseReturnValue:
        if error.connection_invalidated:
            return database_unavailable(error)
        # The class and SQLSTATE (say, 22P02): the message would quote the value refused.
        log.error("database error: %s", diagnose(error).summary)
        return error_response("internal_error", "Something went wrong on our side.", 500)

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> ResponseReturnValue:
        if error.response is not None:
            return error.response  # a page of its own (the sign-in form when throttled)
        code = {404: "not_found", 405: "method_not_allowed", 429: "rate_limited",
                400: "invalid_request", 413: "payload_too_large",
                415: "invalid_request"}.get(error.code or 500, "http_error")
        message = {404: "Not found.", 429: "Too many requests; slow down or use the events stream.",
                   405: "Method not allowed."}.get(error.code or 500, error.name + ".")
        response = error.get_response()
        body, status = error_response(code, message, error.code or 500)
        for header in ("Retry-After", "Allow"):
            if header in response.headers:
                body.headers[header] = response.headers[header]
        if error.code == 429 and "rate_limit_retry_after" in g:  # Flask-Limiter's breach
            body.headers["Retry-After"] = str(g.rate_limit_retry_after)
        return body, status

    @app.errorhandler(Exception)
    def unexpected(error: Exception) -> ResponseReturnValue:
        # The traceback as models.logs formats it: classes, SQLSTATEs and frames, no message.
        log.error("unhandled error: %s", diagnose(error).summary, exc_info=error)
        return error_response("internal_error", "Something went wrong on our side.", 500)
