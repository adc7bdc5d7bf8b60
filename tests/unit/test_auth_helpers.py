"""The pure parts of authentication (webapp/auth.py): what a request presents as its
credential, ids in URLs, and the CSRF token a session must send with every unsafe request."""

from __future__ import annotations

import uuid

import pytest
from flask import Flask, session

from spacejobs.models.errors import InvalidRequest, NotFound
from spacejobs.webapp.auth import (
    bearer_token,
    check_csrf,
    csrf_token,
    parse_id,
    presented_credential,
    remember,
)
from spacejobs.webapp.failed_auth import credential_digest
from tests.unit.offline_app import offline_app


@pytest.fixture(scope="module")
def app() -> Flask:
    return offline_app(SECRET_KEY="unit-test-key")


@pytest.mark.parametrize(("header", "token"), [
    ("Bearer sj_abc", "sj_abc"), ("bearer  sj_abc  ", "sj_abc"), ("BEARER sj_abc", "sj_abc"),
    ("", None), ("Bearer", None), ("Bearer    ", None), ("Basic sj_abc", None), ("sj_abc", None),
    ("Token sj_abc", None),
])
def test_only_a_non_empty_bearer_header_is_a_token(app, header, token):
    with app.test_request_context("/", headers={"Authorization": header}):
        assert bearer_token() == token


def test_the_credential_presented_is_the_token_first_then_the_sessions_id(app):
    with app.test_request_context("/", headers={"Authorization": "Bearer sj_t"}):
        session["sid"] = "s1"
        assert presented_credential() == "token:sj_t"  # a token is judged alone
    with app.test_request_context("/"):
        assert presented_credential() is None
        session["sid"] = "s1"
        assert presented_credential() == "session:s1"
        session["sid"] = ""
        assert presented_credential() is None
        session["sid"] = ["not", "a", "string"]
        assert presented_credential() is None


@pytest.mark.parametrize("value", ["nope", "", "123", "6d0c3e5e-3a4b-4c5d-8e9f", "'; DROP TABLE jobs; --"])
def test_an_id_in_a_url_that_is_not_a_uuid_is_simply_not_found(value):
    with pytest.raises(NotFound):
        parse_id(value)


def test_a_uuid_in_any_spelling_is_the_same_id():
    job_id = uuid.uuid4()
    assert parse_id(str(job_id).upper()) == parse_id(job_id.hex) == job_id


def test_a_csrf_token_is_tied_to_the_session_and_the_apps_key(app):
    with app.test_request_context("/"):
        session["sid"] = "session-a"
        first = csrf_token()
        assert csrf_token() == first  # nothing stored, the same every time
        session["sid"] = "session-b"
        assert csrf_token() != first  # a new session gets a new token
    other = offline_app(SECRET_KEY="another-key")
    with other.test_request_context("/"):
        session["sid"] = "session-a"
        assert csrf_token() != first


def test_before_sign_in_a_random_basis_is_kept_in_the_cookie(app):
    with app.test_request_context("/login"):
        token = csrf_token()
        assert session["anon"] and csrf_token() == token


@pytest.mark.parametrize("send", [None, "", "0" * 64, "forged"])
def test_an_unsafe_request_without_the_right_csrf_token_is_refused(app, send):
    data = {"csrf": send} if send is not None else {}
    with app.test_request_context("/x", method="POST", data=data):
        session["sid"] = "session-a"
        with pytest.raises(InvalidRequest, match="reload the page"):
            check_csrf()


def test_the_csrf_token_may_come_in_the_form_or_a_header(app):
    with app.test_request_context("/x", method="POST"):
        session["sid"] = "session-a"
        token = csrf_token()
    for request in ({"data": {"csrf": token}}, {"headers": {"X-CSRF-Token": token}}):
        with app.test_request_context("/x", method="POST", **request):
            session["sid"] = "session-a"
            check_csrf()  # no exception


def test_a_session_authenticates_an_unsafe_request_only_with_its_csrf_token(app):
    user = object()
    with app.test_request_context("/x", method="GET"):
        session["sid"] = "s"
        assert remember(user, "session") is user  # safe: no token needed
    with app.test_request_context("/x", method="POST"):
        session["sid"] = "s"
        with pytest.raises(InvalidRequest):
            remember(user, "session")
    with app.test_request_context("/x", method="POST", headers={"Authorization": "Bearer sj_t"}):
        assert remember(user, "token") is user  # a token is no ambient credential


def test_an_accepted_credential_is_remembered_as_good(app):
    with app.test_request_context("/", headers={"Authorization": "Bearer sj_good"}):
        remember(object(), "token")
    assert credential_digest("token:sj_good") in app.extensions["spacejobs.known_good"]
    assert credential_digest("token:sj_other") not in app.extensions["spacejobs.known_good"]
