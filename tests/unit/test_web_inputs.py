"""What the web accepts before any view reads it (webapp/inputs.py): every JSON document, query
string and form field PostgreSQL or Python would choke on is refused here, in words that never
quote the document."""

from __future__ import annotations

import json
import math

import pytest
from flask import Flask, request

from spacejobs.models.errors import DomainError, InvalidRequest
from spacejobs.webapp import inputs
from spacejobs.webapp.inputs import INT4_MAX, MalformedJSON, bounded_float, parse_json, whole_number


@pytest.mark.parametrize(("document", "reason"), [
    (b"\xff\xfe{}", "it is not UTF-8 text"),
    ("[" * 100_000 + "]" * 100_000, "it nests arrays and objects more than 72 levels deep"),
    ('{"a": NaN}', "NaN is not a JSON value"),
    ('[Infinity]', "Infinity is not a JSON value"),
    ('[-Infinity]', "-Infinity is not a JSON value"),
    ('{"n": 1e999}', "a number is too large"),
    ("[" + "9" * 5000 + "]", "a number is too large"),
    ('{"a": 1, "a": 2}', "an object repeats a key"),
    ('{"a": "x\\u0000y"}', "a string holds a NUL character"),
    ('{"k\\u0000": 1}', "a string holds a NUL character"),
    ('[[["deep \\u0000"]]]', "a string holds a NUL character"),
    ('{"a": "\\ud800"}', "a string holds a lone surrogate"),
    ('{"\\udfff": 1}', "a string holds a lone surrogate"),
])
def test_a_document_postgresql_or_python_cannot_take_is_refused_saying_why(document, reason):
    with pytest.raises(MalformedJSON) as refused:
        parse_json(document)
    assert str(refused.value) == reason


def test_a_syntax_error_names_where_and_never_the_content():
    with pytest.raises(MalformedJSON) as refused:
        parse_json('{"secret-token": "sj_abc",\n  oops}')
    assert str(refused.value) == "line 2, column 3"
    assert "sj_abc" not in str(refused.value)


def test_the_same_key_in_two_different_objects_is_not_a_repeat():
    assert parse_json('[{"a": 1}, {"a": 2}]') == [{"a": 1}, {"a": 2}]


def test_well_formed_documents_are_read_as_json_reads_them():
    document = ('{"n": 1.5, "i": -3, "big": 1e308, "s": "caf\\u00e9", "pair": "\\ud83d\\ude00",'
                ' "l": [null, true]}')
    assert parse_json(document) == json.loads(document)
    assert parse_json(b'\xef\xbb\xbf{"bom": 1}') == {"bom": 1}  # a UTF-8 byte-order mark is fine
    assert parse_json('"the text \\\\u0000"') == "the text \\u0000"  # an escaped backslash, no NUL


def test_a_refusal_is_a_value_error_so_flask_answers_400_for_it():
    assert issubclass(MalformedJSON, ValueError)


def _app() -> Flask:
    app = Flask(__name__)
    inputs.install(app)

    @app.errorhandler(DomainError)
    def domain_error(error: DomainError):  # the app's own mapping is webapp/errors.py
        return {"code": error.code}, 400

    @app.post("/echo")
    @app.get("/echo")
    def echo():
        return {"json": request.get_json(silent=True), "form": dict(request.form),
                "args": dict(request.args)}

    return app


def test_the_apps_json_provider_is_the_strict_parser():
    client = _app().test_client()
    ok = client.post("/echo", data='{"a": 1}', content_type="application/json")
    assert ok.get_json()["json"] == {"a": 1}
    repeated = client.post("/echo", data='{"a": 1, "a": 2}', content_type="application/json")
    assert repeated.status_code == 200 and repeated.get_json()["json"] is None  # no JSON object
    with pytest.raises(TypeError):
        _app().json.loads("{}", parse_float=float)  # no way around the strict parser


@pytest.mark.parametrize(("url", "form"), [
    ("/echo%00", None), ("/echo?q=a%00b", None), ("/echo?a%00=1", None),
    ("/echo", {"name": "x\x00"}), ("/echo", {"x\x00": "1"}),
])
def test_a_nul_anywhere_in_the_url_or_a_form_is_refused_on_every_url(url, form):
    client = _app().test_client()
    answer = client.post(url, data=form) if form else client.get(url)
    assert answer.status_code == 400 and answer.get_json() == {"code": "invalid_request"}


def test_a_nul_in_a_json_body_is_left_to_the_json_parser_not_the_form_check():
    client = _app().test_client()
    answer = client.post("/echo", data='{"a": "\\u0000"}', content_type="application/json")
    assert answer.status_code == 200 and answer.get_json()["json"] is None


@pytest.mark.parametrize(("raw", "value"), [("0", 0.0), ("2.5", 2.5), ("10", 10.0), (" 1e1 ", 10.0)])
def test_a_bounded_float_takes_finite_numbers_in_range(raw, value):
    assert bounded_float(raw, "seconds", low=0, high=10) == value


@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf", "1e999", "10.01", "-0.1", "", "ten"])
def test_a_bounded_float_refuses_the_rest_naming_the_field(raw):
    with pytest.raises(InvalidRequest) as refused:
        bounded_float(raw, "seconds", low=0, high=10)
    assert refused.value.details["fields"] == ["seconds"]
    assert refused.value.message == "seconds must be a number from 0 to 10."


@pytest.mark.parametrize(("raw", "value"), [(0, 0), (7, 7), ("42", 42), (" 3 ", 3), (INT4_MAX, INT4_MAX)])
def test_a_whole_number_takes_json_integers_and_form_digits(raw, value):
    assert whole_number(raw, "limit") == value


@pytest.mark.parametrize("raw", [True, False, 1.0, -1, INT4_MAX + 1, "-1", "1.5", "1e3", "٣",
                                 "9" * 13, "", None, [1], math.nan])
def test_a_whole_number_refuses_booleans_floats_signs_and_foreign_digits(raw):
    with pytest.raises(InvalidRequest) as refused:
        whole_number(raw, "limit")
    assert refused.value.details["fields"] == ["limit"]


def test_a_whole_number_keeps_to_its_own_bounds():
    assert whole_number("5", "n", low=5, high=6) == 5
    with pytest.raises(InvalidRequest, match="from 5 to 6"):
        whole_number(4, "n", low=5, high=6)
