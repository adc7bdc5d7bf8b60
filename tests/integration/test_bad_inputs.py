"""Inputs that answered 500: each is a 400 with the usual error body now."""

from __future__ import annotations

import base64

import jsonschema
import pytest

from tests.kit.stack import Stack

DEEP = "[" * 50_000 + "]" * 50_000


@pytest.fixture(scope="module")
def app(bare_stack: Stack):
    return bare_stack.make_app()


@pytest.fixture(scope="module")
def people(bare_stack: Stack):
    org = bare_stack.org()
    return org, bare_stack.user(org, role="owner"), bare_stack.operator()


def assert_400(answer, *codes: str) -> None:
    assert answer.status_code == 400, (answer.status_code, answer.get_data(as_text=True)[:500])
    error = answer.get_json()["error"]
    assert error["code"] in (codes or ("invalid_request",)) and error["message"]


@pytest.mark.parametrize("body", [
    DEEP,                                                        # RecursionError in the parser
    '{"kind": "bench.noop", "params": {"a": ' + DEEP + "}}",
    '{"kind": "bench.sleep", "params": {"seconds": NaN}}',       # not JSON; jsonb has no NaN
    '{"kind": "bench.noop", "params": {"x": Infinity}}',
    '{"kind": "bench.noop", "params": {"x": 1e999}}',             # overflows to infinity
    '{"kind": "bench.noop", "dedup_key": "a\\u0000b"}',           # PostgreSQL text has no NUL
    '{"kind": "bench.noop", "params": {"x": "\\u0000"}}',
    '{"kind": "bench.noop", "dedup_key": "\\ud800"}',             # a lone surrogate
    '{"kind": "bench.noop", "dedup_key": "' + "k" * 100_000 + '"}',
    '{"kind": "' + "k" * 100_000 + '"}',
    '{"kind": "bench.noop", "params": {"x": 1' + "0" * 5000 + "}}",   # past int's digit limit
    '{"kind": "bench.sleep", "kind": "bench.noop"}',              # which kind? (was 202: the last)
])
def test_malformed_json_bodies_are_400(client, people, body):
    org, anna, _ = people
    answer = client.post(f"/api/v1/orgs/{org}/jobs", data=body, headers=anna.auth,
                         content_type="application/json")
    assert_400(answer, "invalid_request", "invalid_params", "unknown_kind")


def test_bad_utf8_and_nul_in_a_project_name_are_400(client, people):
    org, anna, _ = people
    assert_400(client.post(f"/api/v1/orgs/{org}/projects", data=b'{"name": "\xff\xfe"}',
                           headers=anna.auth, content_type="application/json"))
    assert_400(client.post(f"/api/v1/orgs/{org}/projects", json={"name": "a\x00b"}, headers=anna.auth))
    assert_400(client.post(f"/api/v1/orgs/{org}/jobs:batch", data="[" * 3000 + "]" * 3000,
                           headers=anna.auth, content_type="application/json"))


@pytest.mark.parametrize("query", [
    "kind=%00", "status=%00", "cursor=%00", "limit=" + "9" * 5000, "limit=1e3", "cursor=!!!",
    "cursor=" + base64.urlsafe_b64encode(b"not a date|not an id").decode(),
    "cursor=" + base64.urlsafe_b64encode(b"\xff\xfe").decode(),
])
def test_bad_pagination_and_filters_are_400(client, people, query):
    org, anna, _ = people
    assert_400(client.get(f"/api/v1/orgs/{org}/jobs?{query}", headers=anna.auth))


def test_huge_page_sizes_and_long_filters_are_clamped_not_errors(client, people):
    org, anna, _ = people
    assert client.get(f"/api/v1/orgs/{org}/jobs?limit=99999999999999999999", headers=anna.auth
                      ).status_code == 200
    assert client.get(f"/api/v1/orgs/{org}/jobs?kind={'k' * 10_000}", headers=anna.auth
                      ).get_json()["jobs"] == []


@pytest.mark.parametrize("key", ["k" * 201, "caf\u00e9", "a\tb"])
def test_an_idempotency_key_must_be_printable_ascii(client, people, key):
    org, anna, _ = people
    answer = client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": "bench.noop"},
                         headers=anna.auth | {"Idempotency-Key": key.encode().decode("latin-1")})
    assert_400(answer)


@pytest.mark.parametrize("hours", ["inf", "-inf", "nan", "1e400", "-1", "876001", "x"])
def test_ops_hours_must_be_a_finite_span(client, people, hours):
    _, _, olga = people
    assert_400(client.get(f"/ops/api/jobs?hours={hours}", headers=olga.auth))


def test_ops_hours_within_range_is_fine(client, people):
    _, _, olga = people
    assert client.get("/ops/api/jobs?hours=0.5", headers=olga.auth).status_code == 200


@pytest.mark.parametrize("limit", [2**31, 10**20, "9" * 30, 1.5, True, -1, "1e3", "\u0661"])
def test_an_ops_concurrency_limit_must_fit_the_column(client, people, limit):
    _, _, olga = people
    assert_400(client.post("/ops/api/kinds/bench.noop/limit", json={"limit": limit}, headers=olga.auth))


def test_an_ops_concurrency_limit_in_range_is_set(client, people):
    _, _, olga = people
    assert client.post("/ops/api/kinds/bench.noop/limit", json={"limit": 2**31 - 1},
                       headers=olga.auth).status_code == 200
    assert client.post("/ops/api/kinds/bench.noop/limit", json={"limit": None},
                       headers=olga.auth).status_code == 200


def test_a_nul_in_any_path_is_the_same_400(client, people):
    _, _, olga = people
    ops = client.post("/ops/api/kinds/a%00b/pause", headers=olga.auth)
    assert_400(ops)
    stranger = client.post("/ops/api/kinds/a%00b/pause")
    nowhere = client.post("/nope/a%00b")
    assert stranger.get_data() == nowhere.get_data() and stranger.status_code == nowhere.status_code == 400


def test_a_failing_statement_never_carries_its_parameters(bare_stack: Stack):
    """hide_parameters on every engine: the operators' tracebacks (job_diagnostics) and the
    logs show a failed statement, never the tenant data bound to it."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from spacejobs.models.db.engine import make_engine

    engine = make_engine(bare_stack.app_url, pool_size=1)
    try:
        with pytest.raises(DBAPIError) as failure, engine.connect() as conn:
            conn.execute(text("SELECT 1 / 0, CAST(:secret AS text)"), {"secret": "tenant-secret-4711"})
    finally:
        engine.dispose()
    assert "tenant-secret-4711" not in str(failure.value)


#: what a member might type into a params field: never sent back, never logged
TENANT_SECRET = "TENANT-SECRET-4711-xyz"


@pytest.mark.parametrize(("kind", "params", "reasons"), [
    ("bench.sleep", {"seconds": 61}, [{"field": "seconds", "reason": "must be ≤ 60"}]),
    ("bench.sleep", {"seconds": TENANT_SECRET}, [{"field": "seconds", "reason": "must be a number"}]),
    ("projects_import", {}, [{"field": "projects", "reason": "required"}]),
    ("projects_import", {"projects": [{"name": TENANT_SECRET * 20}, {"name": "ok", "size": 1}]},
     [{"field": "projects.0.name", "reason": "must have at most 200 characters"},
      {"field": "projects.1.size", "reason": "not a parameter of this kind"}]),
])
def test_invalid_params_say_why_per_field_and_never_echo_the_value(client, people, caplog, kind,
                                                                   params, reasons):
    org, anna, _ = people
    caplog.set_level("DEBUG")
    answer = client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": kind, "params": params},
                         headers=anna.auth)
    assert_400(answer, "invalid_params")
    error = answer.get_json()["error"]
    assert error["reasons"] == reasons
    assert error["fields"] == [r["field"] for r in reasons]  # the names alone, as before
    assert error["message"] == "The job parameters are not valid: " + "; ".join(
        f"{r['field']}: {r['reason']}" for r in reasons) + "."
    assert TENANT_SECRET not in answer.get_data(as_text=True)
    assert TENANT_SECRET not in caplog.text


def test_a_batch_s_invalid_params_say_which_job_and_why(client, people):
    org, anna, _ = people
    jobs = [{"kind": "bench.noop"}, {"kind": "bench.sleep", "params": {"seconds": -1}}]
    answer = client.post(f"/api/v1/orgs/{org}/jobs:batch", json={"jobs": jobs}, headers=anna.auth)
    assert_400(answer, "invalid_params")
    error = answer.get_json()["error"]
    assert (error["index"], error["reasons"]) == (1, [{"field": "seconds", "reason": "must be ≥ 0"}])


def test_the_openapi_document_describes_the_reasons(client, people):
    """The answer conforms to the document's Error (whose bodies allow no undeclared field)."""
    org, anna, _ = people
    document = client.get("/api/v1/openapi.json").get_json()
    answer = client.post(f"/api/v1/orgs/{org}/jobs",
                         json={"kind": "bench.sleep", "params": {"seconds": 61}}, headers=anna.auth)
    assert answer.get_json()["error"]["reasons"]
    schema = {"$ref": "#/components/schemas/Error", "components": document["components"]}
    jsonschema.validate(answer.get_json(), schema)
    with pytest.raises(jsonschema.ValidationError):  # the check can fail: reasons are typed
        jsonschema.validate({"error": {"code": "invalid_params", "message": "m",
                                       "reasons": [{"field": "seconds"}]}}, schema)
