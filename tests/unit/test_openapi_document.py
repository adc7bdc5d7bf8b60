"""The OpenAPI document (webapp/openapi.py), built from the real app's routes without a server:
every JSON API route is documented where it is routed, and its error answers are the error
table's, so the two cannot differ."""

from __future__ import annotations

import re

import pytest
from flask import Flask

from spacejobs.models.kinds import get_any_kind, submittable_kinds
from spacejobs.webapp import openapi
from spacejobs.webapp.errors import HTTP_STATUS
from tests.unit.offline_app import offline_app


@pytest.fixture(scope="module")
def app() -> Flask:
    return offline_app()


@pytest.fixture(scope="module")
def document(app) -> dict:
    return openapi.document(app)


def operations(document: dict):
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            yield path, method, operation


def test_every_json_api_route_is_documented_at_its_path_and_method(app, document):
    routed = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint.startswith("api."):
            path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
            routed |= {(path, m.lower()) for m in rule.methods - {"HEAD", "OPTIONS"}}
    assert routed == {(path, method) for path, method, _ in operations(document)}


def test_a_route_without_an_operation_fails_the_build():
    app = offline_app()
    app.add_url_rule("/api/v1/undocumented", "api.undocumented", lambda: "")
    with pytest.raises(RuntimeError, match=r"api\.undocumented"):
        openapi.document(app)


def test_every_path_parameter_is_required_and_an_id_unless_it_is_a_signals_name(document):
    for path, _, operation in operations(document):
        in_path = {p["name"]: p for p in operation["parameters"] if p["in"] == "path"}
        assert set(in_path) == set(re.findall(r"{([^}]+)}", path))
        assert all(p["required"] for p in in_path.values())
        assert all(p["schema"].get("format") == "uuid" for n, p in in_path.items() if n != "name")
        if "name" in in_path:
            assert path.endswith("/signals/{name}")
            assert in_path["name"]["schema"]["pattern"] == "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


def test_each_error_answer_lists_exactly_the_codes_the_table_maps_to_its_status(document):
    for _, _, operation in operations(document):
        for status, answer in operation["responses"].items():
            if int(status) < 400:
                continue
            listed = answer["content"]["application/json"]["schema"]["properties"]["error"][
                "properties"]["code"]["enum"]
            assert {HTTP_STATUS[code] for code in listed} == {int(status)}
            assert answer["description"] == ", ".join(listed)


def test_every_operation_may_answer_the_errors_of_any_request(document):
    for _, _, operation in operations(document):
        for code in openapi.ANY_REQUEST:
            assert str(HTTP_STATUS[code]) in operation["responses"]


def test_refusals_that_ask_the_client_to_wait_carry_retry_after(document):
    for _, _, operation in operations(document):
        for status in ("429", "503"):
            assert operation["responses"][status]["headers"] == openapi.RETRY_AFTER


def test_only_the_document_itself_is_public(document):
    public = [operation["operationId"] for _, _, operation in operations(document)
              if operation.get("security") == []]
    assert public == ["openapi_document"]
    assert document["security"] == [{"bearer": []}]


def test_operation_ids_are_unique_and_links_name_existing_ones(document):
    ids = [operation["operationId"] for _, _, operation in operations(document)]
    assert len(ids) == len(set(ids))
    for _, _, operation in operations(document):
        for answer in operation["responses"].values():
            for link in answer.get("links", {}).values():
                assert link["operationId"] in ids


def test_request_bodies_and_answers_refer_to_schemas_the_document_holds(document):
    schemas = document["components"]["schemas"]
    for ref in re.findall(r"#/components/schemas/(\w+)", str(document["paths"])):
        assert ref in schemas


def test_a_submit_names_the_kinds_it_takes_and_never_a_child_only_one(document):
    kinds = document["components"]["schemas"]["SubmitJob"]["properties"]["kind"]["enum"]
    assert kinds == submittable_kinds() and "projects_export" in kinds
    child = "projects_report.project"
    assert get_any_kind(child).rules.child_only
    assert child not in str(document)


def test_the_document_is_built_once_per_app(app, document):
    assert openapi.document(app) is document


def test_a_workflows_params_are_typed_as_steps_not_a_free_object(document):
    schemas = document["components"]["schemas"]
    for body in ("SubmitJob", "BatchJob"):
        (rule,) = schemas[body]["allOf"]
        assert rule["if"]["properties"]["kind"] == {"const": "workflow"}
        assert rule["then"]["properties"]["params"] == {
            "$ref": "#/components/schemas/WorkflowParams"}
    workflow = schemas["WorkflowParams"]
    assert workflow["properties"]["steps"]["items"] == {"$ref": "#/components/schemas/StepNode"}
    assert workflow["properties"]["policy"]["enum"] == ["fail_fast", "run_all"]
    step = schemas["StepNode"]
    assert set(step["properties"]) == {"name", "kind", "params", "after", "waits"}
    assert step["required"] == ["name", "kind"]
    assert step["properties"]["after"]["items"] == {"type": "integer"}
    assert step["properties"]["kind"]["enum"] == [k for k in submittable_kinds() if k != "workflow"]


def test_an_error_may_name_the_refused_step_and_a_job_links_its_steps_and_parent(document):
    schemas = document["components"]["schemas"]
    # a step by its index, or the workflow's failure handler by its name
    assert schemas["ErrorBody"]["properties"]["step"]["anyOf"] == [
        {"type": "integer"}, {"const": "on_failure", "type": "string"}, {"type": "null"}]
    assert {"steps", "parent"} <= set(schemas["JobLinks"]["properties"])
    assert "parent" not in schemas["JobLinks"]["required"]
    assert {"parent_id", "place"} <= set(schemas["Job"]["required"])
    assert schemas["Step"]["properties"]["status"]["anyOf"][-1]["enum"] == ["pending", "skipped"]
    signal = document["paths"]["/api/v1/orgs/{org}/jobs/{job_id}/signals/{name}"]["post"]
    assert "no_step_waits" in signal["responses"]["409"]["description"]
