"""The depth and size checks of every JSON door (models/json_limits.py): exact at the limit,
iterative (never a RecursionError, whatever the depth), and refusals that name the field and
the limit, never the value."""

from __future__ import annotations

import sys
import uuid
from typing import Any

import pytest
from flask import Flask, request

from spacejobs.models.errors import DomainError, InvalidRequest, ResultNotStorable
from spacejobs.models.json_limits import (
    MAX_DEPTH,
    MAX_ENVELOPE_DEPTH,
    check_depth,
    check_params,
    check_size,
    check_written,
    encoded_size,
    nests_past,
)
from spacejobs.models.results.attempt import encode_result
from spacejobs.tasks.engine.context import _jsonable
from spacejobs.webapp import inputs
from spacejobs.webapp.inputs import NestedTooDeep, parse_json

MARKER = "MARKER-" + uuid.uuid4().hex[:8]


def lists(depth: int, inner: Any = None) -> Any:
    """``depth`` levels of lists around ``inner`` (``[]`` innermost when None)."""
    value: Any = [] if inner is None else [inner]
    for _ in range(depth - 1):
        value = [value]
    return value


def objects(depth: int) -> Any:
    value: Any = {"leaf": MARKER}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_the_limits_are_64_for_a_value_and_8_more_for_what_carries_one():
    assert (MAX_DEPTH, MAX_ENVELOPE_DEPTH) == (64, 72)


@pytest.mark.parametrize("make", [lists, objects,
                                  lambda n: (lists(n - 1),),  # a tuple, as json.dumps writes one
                                  lambda n: {"x": [1, "s", lists(n - 3, {"k": None})]}])
def test_exactly_64_levels_pass_and_65_do_not(make):
    assert not nests_past(make(64), 64)
    assert nests_past(make(65), 64)


@pytest.mark.parametrize(("value", "depth"), [
    (None, 0), (1, 0), ("[[[[", 0), ([], 1), ({}, 1), ([1, "x", None], 1), ({"a": []}, 2),
    ([[], [[]], []], 3), ({"a": 1, "b": {"c": [1, [2]]}}, 4),
])
def test_depth_counts_levels_of_arrays_and_objects_only(value, depth):
    assert not nests_past(value, depth)
    assert nests_past(value, depth - 1) == (depth > 0)


def test_a_list_100000_deep_is_refused_without_recursion_even_on_a_tiny_stack():
    deep = lists(100_000)
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(60)  # a recursive walk would need 100,000 frames
    try:
        assert nests_past(deep, 64)
        with pytest.raises(InvalidRequest):
            check_depth(deep, "A signal's payload", "payload")
    finally:
        sys.setrecursionlimit(old)


def test_a_value_that_contains_itself_is_too_deep_not_an_endless_walk():
    loop: list[Any] = []
    loop.append(loop)
    assert nests_past(loop, 64)


def test_a_refusal_names_the_field_and_the_limit_never_the_value():
    with pytest.raises(InvalidRequest) as refused:
        check_depth(objects(65), "A signal's payload", "payload")
    assert refused.value.message == "A signal's payload may nest arrays and objects at most 64 levels deep."
    assert refused.value.details == {"fields": ["payload"]}
    assert MARKER not in str(refused.value)


def test_a_jobs_params_may_use_every_level_and_a_workflows_steps_theirs():
    check_params({"data": lists(63)})
    with pytest.raises(InvalidRequest) as refused:
        check_params({"data": lists(64)})
    assert refused.value.details == {"fields": ["params"]}
    step = {"name": "a", "kind": "test.echo", "params": {"data": lists(63)}}  # 64 levels
    check_params({"steps": [step, step]}, workflow=True)  # the whole: 3 + 64 = 67
    too_deep = {**step, "params": {"data": lists(64)}}
    with pytest.raises(InvalidRequest) as refused:
        check_params({"steps": [step, too_deep]}, workflow=True)
    assert refused.value.details == {"fields": ["steps"], "step": 1}
    with pytest.raises(InvalidRequest) as refused:  # what is not a step's params: 72 for the whole
        check_params({"steps": [step], "policy": lists(72)}, workflow=True)
    assert refused.value.details == {"fields": ["params"]}
    check_params({"steps": "not a list"}, workflow=True)  # the kind's model refuses the shape


def test_a_size_is_compact_utf8_json_exact_at_its_limit():
    value = {"s": "é" * 10}  # {"s":"éé…"}: 8 bytes + 20
    assert encoded_size(value) == 28
    check_size(value, "A signal's payload", "payload", 28)
    with pytest.raises(InvalidRequest) as refused:
        check_size(value, "A signal's payload", "payload", 27)
    assert refused.value.details == {"fields": ["payload"]}
    assert refused.value.message == "A signal's payload holds at most 27 bytes."
    with pytest.raises(InvalidRequest, match="at most 64 KiB"):
        check_size("x" * 65_536, "A signal's payload", "payload", 64 * 1024)


@pytest.mark.parametrize("value", [float("nan"), [float("inf")], {"at": object()}])
def test_a_value_json_cannot_hold_is_refused_by_the_size_check_not_raised_through(value):
    with pytest.raises(InvalidRequest) as refused:
        check_size(value, "A signal's payload", "payload", 1024)
    assert refused.value.details == {"fields": ["payload"]}


def test_what_a_kind_writes_may_wrap_a_value_at_the_limit_and_no_more():
    check_written(lists(72), "The job's result")
    with pytest.raises(ResultNotStorable) as refused:
        check_written(lists(73), "The job's result")
    assert refused.value.permanent and refused.value.code == "result_not_storable"
    assert refused.value.message == ("The job's result cannot be kept: it nests arrays and objects "
                                     "more than 72 levels deep.")


@pytest.mark.parametrize("depth", [73, 950, 100_000])
def test_a_result_or_a_step_nested_past_the_limit_is_not_storable_never_a_recursion_error(depth):
    with pytest.raises(ResultNotStorable):
        encode_result({"x": lists(depth - 1)})
    with pytest.raises(ResultNotStorable):
        _jsonable(lists(depth), "the step")
    assert encode_result(lists(72)) == ("[" * 72 + "]" * 72).encode()


# -- the web's parser ------------------------------------------------------------------------

@pytest.mark.parametrize("depth", [73, 950, 100_000])
def test_a_body_past_72_levels_is_refused_as_nested_too_deep(depth):
    with pytest.raises(NestedTooDeep) as refused:
        parse_json("[" * depth + "]" * depth)
    assert str(refused.value) == "it nests arrays and objects more than 72 levels deep"


def test_a_body_may_carry_a_value_at_the_limit_in_its_envelope():
    batch = '{"jobs": [{"params": {"steps": [{"params": ' + "[" * 64 + "]" * 64 + "}]}}]}"
    assert parse_json(batch)["jobs"][0]["params"]["steps"][0]["params"] == lists(64)
    assert parse_json("[" * 72 + "]" * 72) == lists(72)


def test_a_file_is_held_to_the_limit_of_a_value():
    assert parse_json("[" * 64 + "]" * 64, max_depth=MAX_DEPTH) == lists(64)
    with pytest.raises(NestedTooDeep, match="more than 64 levels deep"):
        parse_json("[" * 65 + "]" * 65, max_depth=MAX_DEPTH)


def test_the_apps_json_provider_answers_a_deep_body_with_the_limit_on_any_route():
    app = Flask(__name__)
    inputs.install(app)

    @app.errorhandler(DomainError)
    def domain_error(error: DomainError):
        return {"code": error.code, "message": error.message, "fields": error.details["fields"]}, 400

    @app.post("/echo")
    def echo():
        return {"json": request.get_json(silent=True)}

    client = app.test_client()
    deep = client.post("/echo", data="[" * 950 + "]" * 950, content_type="application/json")
    assert deep.status_code == 400 and deep.get_json() == {
        "code": "invalid_request", "fields": ["body"],
        "message": "The body nests arrays and objects too deeply: the values it carries (params, "
                   "a signal's payload) may nest them at most 64 levels deep."}
    fine = client.post("/echo", data="[" * 72 + "]" * 72, content_type="application/json")
    assert fine.status_code == 200
