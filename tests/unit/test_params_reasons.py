"""``invalid_params`` says why each field was refused, and never what was submitted."""

from __future__ import annotations

import json
import re
from datetime import date, datetime, timedelta
from decimal import Decimal
from enum import Enum
from typing import Annotated, Any, Literal
from uuid import UUID

import pytest
from pydantic import Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError
from pydantic_core._pydantic_core import list_all_errors

from spacejobs.models.errors import InvalidParams
from spacejobs.models.kinds import reasons
from spacejobs.models.kinds.rules import JobKind, KindRules, Params

#: what a member might type into a params field: it must never come back in the error
SECRET = "TENANT-SECRET-4711-xyz"


def kind_of(model: type[Params]) -> JobKind:
    rules = KindRules(name="unit.reasons", org_states=frozenset({"active"}), role="member",
                      max_attempts=1, backoff_base=1.0, backoff_max=1.0,
                      lease=timedelta(seconds=30), time_limit=None, hard_time_limit=None,
                      retry_on_timeout=False, dedupable=True, params=model)
    return JobKind(rules, lambda ctx, params: {})


def refusal(model: type[Params], raw: object) -> InvalidParams:
    with pytest.raises(InvalidParams) as refused:
        kind_of(model).parse_params(raw)
    return refused.value


class Item(Params):
    label: Annotated[str, Field(max_length=3)]


class Order(Params):
    name: str
    count: int = Field(default=1, ge=1, le=10)
    ratio: float = Field(default=0.5, gt=0, lt=1)
    code: str = Field(default="a", min_length=1, max_length=1)
    items: list[Item] = Field(default_factory=list, max_length=2)
    color: Literal["red", "blue"] = "red"


@pytest.mark.parametrize(("raw", "expected"), [
    ({}, {"name": "required"}),
    ({"name": "a", "count": 11}, {"count": "must be ≤ 10"}),
    ({"name": "a", "count": 0}, {"count": "must be ≥ 1"}),
    ({"name": "a", "count": "many"}, {"count": "must be a whole number"}),
    ({"name": "a", "count": 1.5}, {"count": "must be a whole number"}),
    ({"name": "a", "ratio": 1}, {"ratio": "must be < 1"}),
    ({"name": "a", "ratio": 0}, {"ratio": "must be > 0"}),
    ({"name": "a", "code": ""}, {"code": "must have at least 1 character"}),
    ({"name": "a", "code": "ab"}, {"code": "must have at most 1 character"}),
    ({"name": "a", "items": [{"label": "a"}] * 3}, {"items": "must have at most 2 items"}),
    ({"name": "a", "items": [{"label": "long"}]}, {"items.0.label": "must have at most 3 characters"}),
    ({"name": "a", "items": [{}]}, {"items.0.label": "required"}),
    ({"name": "a", "items": {}}, {"items": "must be a list"}),
    ({"name": "a", "color": "green"}, {"color": "must be 'red' or 'blue'"}),
    ({"name": 3}, {"name": "must be a string"}),
    ({"name": "a", "extra": 1}, {"extra": "not a parameter of this kind"}),
])
def test_each_field_says_why(raw, expected):
    error = refusal(Order, raw)
    assert {r["field"]: r["reason"] for r in error.details["reasons"]} == expected
    assert error.details["fields"] == sorted(expected)  # the names alone, as before
    assert error.message == "The job parameters are not valid: " + "; ".join(
        f"{field}: {why}" for field, why in sorted(expected.items())) + "."


def test_several_fields_are_all_named_in_order():
    error = refusal(Order, {"count": 99, "color": "green"})
    assert error.message == ("The job parameters are not valid: color: must be 'red' or 'blue'; "
                             "count: must be ≤ 10; name: required.")
    assert error.details["fields"] == ["color", "count", "name"]


def test_a_long_list_of_reasons_is_cut_short_in_the_message_but_kept_in_the_details():
    class Many(Params):
        values: list[int]

    error = refusal(Many, {"values": ["x"] * 25})
    assert len(error.details["reasons"]) == 25
    assert error.message.endswith("; and 15 more.")
    assert error.message.count("must be a whole number") == reasons.MESSAGE_REASONS


class Color(Enum):
    RED = "red"


class Circle(Params):
    type: Literal["circle"]


class Square(Params):
    type: Literal["square"]


class Leaky(Params):
    """Fields whose pydantic message (``msg``) or ``input`` would carry what was submitted."""

    uuid: UUID | None = None
    slug: str = Field(default="a", pattern="^[a-z]+$")
    short: str = Field(default="a", max_length=3)
    color: Literal["red", "blue"] = "red"
    enum: Color = Color.RED
    count: int = 0
    ratio: float = 0.0
    amount: Decimal = Decimal(0)
    flag: bool = False
    when: datetime | None = None
    day: date | None = None
    wait: timedelta | None = None
    shape: Annotated[Circle | Square, Field(discriminator="type")] | None = None
    checked: str = "ok"
    asserted: str = "ok"
    custom: str = "ok"

    @field_validator("checked")
    @classmethod
    def _quotes_the_value(cls, value: str) -> str:
        raise ValueError(f"{value!r} is not an allowed value")

    @field_validator("asserted")
    @classmethod
    def _asserts_with_the_value(cls, value: str) -> str:
        assert value == "ok", f"got {value}"
        return value

    @field_validator("custom")
    @classmethod
    def _custom_error(cls, value: str) -> str:
        raise PydanticCustomError("not_ours", "no {value} here", {"value": value})


LEAKY_INPUT: dict[str, Any] = {name: SECRET for name in Leaky.model_fields if name != "shape"}
LEAKY_INPUT["shape"] = {"type": SECRET}


def test_pydantic_s_own_messages_would_leak_the_value():
    """The premise: this model does exercise the messages that quote the input."""
    with pytest.raises(ValidationError) as invalid:
        Leaky.model_validate(LEAKY_INPUT)
    leaking = {e["type"] for e in invalid.value.errors() if SECRET in e["msg"]}
    assert {"value_error", "assertion_error", "not_ours", "union_tag_invalid"} <= leaking


def test_a_submitted_value_never_comes_back_in_the_error():
    error = refusal(Leaky, LEAKY_INPUT)
    shown = error.message + json.dumps(error.details, default=str)
    assert SECRET not in shown
    by_field = {r["field"]: r["reason"] for r in error.details["reasons"]}
    assert set(Leaky.model_fields) <= set(by_field)  # every field refused, each with a reason
    assert by_field["uuid"] == "must be a UUID"
    assert by_field["slug"] == "must match the pattern ^[a-z]+$"
    assert by_field["enum"] == "must be 'red'"
    assert by_field["shape"] == "must have 'type' set to one of 'circle', 'square'"
    assert by_field["checked"] == by_field["asserted"] == by_field["custom"] == reasons.NOT_VALID


def test_reasons_read_only_the_model_side_of_an_error_s_context():
    """What a reason may interpolate: a bound, a length, a pattern, allowed values. Pydantic's
    context entries that describe the input (``error``, ``tag``, ``tz_actual``,
    ``actual_length``...) are never read."""
    model_side = {"gt", "ge", "lt", "le", "multiple_of", "pattern", "expected", "expected_version",
                  "tz_expected", "expected_schemes", "discriminator", "expected_tags"}
    used = {name for template in reasons._REASONS.values()
            for name in re.findall(r"{(\w+)}", template)}
    assert used <= model_side
    known = {e["type"]: e["message_template_python"] for e in list_all_errors()}
    for error_type, template in reasons._REASONS.items():
        assert error_type in known, error_type  # a type pydantic has (not a typo)
        assert set(re.findall(r"{(\w+)}", template)) <= set(
            re.findall(r"{(\w+)}", known[error_type])), error_type
    for error_type, (_, entry, _, _) in reasons._COUNTED.items():
        assert "{" + entry + "}" in known[error_type], error_type
