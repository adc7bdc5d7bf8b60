"""Errors as the web answers them (webapp/errors.py): one JSON shape, the status the table
gives each code, the headers a client needs to come back, and never an exception's message."""

from __future__ import annotations

import logging

import pytest
from flask import Flask, request
from limits.errors import StorageError
from sqlalchemy.exc import DBAPIError, OperationalError

from spacejobs.models import errors
from spacejobs.webapp.errors import HTTP_STATUS, UNAVAILABLE_RETRY_AFTER
from tests.unit.offline_app import offline_app

SECRET = "password=hunter2 SELECT * FROM tenant_data"

raised: list[BaseException] = []


class OddError(errors.DomainError):
    code = "odd_code_not_in_the_table"


@pytest.fixture(scope="module")
def app() -> Flask:
    app = offline_app()

    def boom():
        raise raised[-1]

    app.add_url_rule("/boom", "boom", boom, methods=["GET", "POST"])
    app.add_url_rule("/read", "read", lambda: {"got": request.get_json()}, methods=["POST"])
    return app


def answer(app: Flask, error: BaseException, **request: object):
    raised.append(error)
    return app.test_client().get("/boom", **request)


@pytest.mark.parametrize("code", sorted(HTTP_STATUS))
def test_every_domain_code_answers_its_tables_status_in_the_one_shape(app, code):
    error = errors.DomainError("A sentence for the user.")
    error.code = code
    got = answer(app, error)
    assert got.status_code == HTTP_STATUS[code]
    assert got.get_json() == {"error": {"code": code, "message": "A sentence for the user."}}


def test_only_public_details_are_echoed_and_empty_ones_are_left_out(app):
    error = errors.InvalidParams(fields=["seconds"], index=3, job_id=None, secret=SECRET,
                                 organization_id="another-tenant")
    body = answer(app, error).get_json()["error"]
    assert body == {"code": "invalid_params", "message": errors.InvalidParams.message,
                    "fields": ["seconds"], "index": 3}


def test_a_code_missing_from_the_table_is_a_400(app):
    assert answer(app, OddError()).status_code == 400


def test_unauthorized_says_how_to_authenticate(app):
    got = answer(app, errors.Unauthorized())
    assert got.status_code == 401
    assert got.headers["WWW-Authenticate"] == 'Bearer realm="spacejobs"'


def test_a_refusal_with_a_wait_says_how_long_in_retry_after(app):
    got = answer(app, errors.RateLimited(retry_after=17))
    assert (got.status_code, got.headers["Retry-After"]) == (429, "17")
    assert "Retry-After" not in answer(app, errors.NotFound()).headers


def test_a_browser_gets_the_error_as_a_page_and_a_client_as_json(app):
    page = answer(app, errors.OrganizationReadOnly(), headers={"Accept": "text/html"})
    assert page.status_code == 409 and page.mimetype == "text/html"
    assert errors.OrganizationReadOnly.message in page.get_data(as_text=True)
    either = answer(app, errors.OrganizationReadOnly(),
                    headers={"Accept": "application/json, text/html"})
    assert either.mimetype == "application/json"


def test_only_our_own_failures_show_a_request_id_on_the_page(app):
    html = {"Accept": "text/html", "X-Request-ID": "support-me-123"}
    ours = answer(app, RuntimeError(SECRET), headers=html)
    assert ours.status_code == 500 and "support-me-123" in ours.get_data(as_text=True)
    theirs = answer(app, errors.InvalidRequest(), headers=html)
    assert "support-me-123" not in theirs.get_data(as_text=True)


def test_an_unexpected_exception_is_a_500_whose_answer_and_log_hold_no_message(app, caplog):
    with caplog.at_level(logging.ERROR, logger="spacejobs.web"):
        got = answer(app, RuntimeError(SECRET))
    assert got.status_code == 500
    assert got.get_json() == {"error": {"code": "internal_error",
                                        "message": "Something went wrong on our side."}}
    # The log's text is its formatter's (models/logs.py, tested apart): the line itself
    # names the class only.
    assert [r.getMessage() for r in caplog.records] == ["unhandled error: builtins.RuntimeError"]


def test_a_database_that_cannot_be_reached_is_a_503_with_retry_after(app, caplog):
    error = OperationalError("SELECT secret", {"p": "tenant value"}, Exception(SECRET))
    with caplog.at_level(logging.ERROR, logger="spacejobs.web"):
        got = answer(app, error)
    assert got.status_code == 503 and got.headers["Retry-After"] == str(UNAVAILABLE_RETRY_AFTER)
    assert got.get_json()["error"]["code"] == "unavailable"
    assert [r.getMessage() for r in caplog.records] == [
        "database unavailable: sqlalchemy.exc.OperationalError"]


def test_a_refused_statement_is_a_500_unless_the_connection_was_lost(app):
    refused = DBAPIError("SELECT 1", None, Exception(SECRET))
    got = answer(app, refused)
    assert got.status_code == 500 and "hunter2" not in got.get_data(as_text=True)
    lost = DBAPIError("SELECT 1", None, Exception(SECRET), connection_invalidated=True)
    assert answer(app, lost).status_code == 503


def test_rate_limit_counters_that_fail_closed_are_a_503(app):
    got = answer(app, StorageError(ConnectionError(SECRET)))
    assert got.status_code == 503 and got.headers["Retry-After"] == str(UNAVAILABLE_RETRY_AFTER)


def test_an_unknown_url_and_a_wrong_method_answer_in_the_same_shape(app):
    client = app.test_client()
    missing = client.get("/no/such/url")
    assert (missing.status_code, missing.get_json()) == (
        404, {"error": {"code": "not_found", "message": "Not found."}})
    wrong = client.delete("/boom")
    assert wrong.status_code == 405
    assert wrong.get_json()["error"]["code"] == "method_not_allowed"
    assert set(wrong.headers["Allow"].split(", ")) >= {"GET", "POST"}


def test_a_body_over_one_mebibyte_is_payload_too_large(app):
    client = app.test_client()
    assert client.post("/read", json={"a": 1}).get_json() == {"got": {"a": 1}}
    got = client.post("/read", data=b"x" * (1024 * 1024 + 1), content_type="application/json")
    assert got.status_code == 413 and got.get_json()["error"]["code"] == "payload_too_large"
