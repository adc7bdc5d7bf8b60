"""The form a params model makes (webapp/forms.py), and what a person typed into it."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from pydantic import Field

from spacejobs.models.errors import InvalidParams
from spacejobs.models.kinds import Params, job_kind, registered_kinds
from spacejobs.webapp.forms import FormField, form_of, typed_values


class Everything(Params):
    count: Annotated[int, Field(ge=1, le=10, description="How many.")] = 3
    ratio: float
    loud: bool = False
    color: Literal["red", "blue"] = "red"
    name: Annotated[str, Field(max_length=40, title="Its name")]
    note: str | None = None


class Rich(Params):
    items: list[int]


def test_each_field_is_an_input_of_its_type_with_its_bounds_default_and_words():
    form = form_of(Everything)
    assert not form.rich
    fields = {f.name: f for f in form.fields}
    assert fields["count"] == FormField("count", "Count", "number", False, "3", "How many.",
                                        minimum="1", maximum="10", step="1")
    assert (fields["ratio"].input, fields["ratio"].required, fields["ratio"].step) == ("number", True, "any")
    assert (fields["loud"].input, fields["loud"].default) == ("checkbox", "false")
    assert (fields["color"].input, fields["color"].choices) == ("select", ("red", "blue"))
    assert (fields["name"].input, fields["name"].title, fields["name"].required) == ("text", "Its name", True)
    assert (fields["note"].input, fields["note"].required) == ("textarea", False)


def test_a_model_with_a_list_is_too_rich_for_a_form():
    assert form_of(Rich).rich


def test_what_was_typed_goes_to_the_model_as_text_and_empty_fields_take_their_default():
    form = form_of(Everything)
    values = typed_values(form, {"count": "", "ratio": "0.5", "name": "Vostok", "loud": "true"})
    assert values == {"ratio": "0.5", "name": "Vostok", "loud": True}
    assert Everything.model_validate(values).count == 3
    assert typed_values(form, {"ratio": "1", "name": "x"})["loud"] is False


def test_a_kind_declares_its_label_its_page_start_and_its_signals_each_checked_by_a_model():
    @job_kind("test.forms.declared", org_states={"active"}, label="Declared", description="It is.",
              start_from_pages=True, signals={"go": Everything})
    def declared(ctx, params: Everything):  # type: ignore[no-untyped-def]
        return None

    rules = registered_kinds()["test.forms.declared"].rules
    assert (rules.shown_label, rules.description, rules.start_from_pages) == ("Declared", "It is.", True)
    assert rules.parse_signal("go", {"ratio": 1, "name": "x"})["count"] == 3
    assert rules.parse_signal("undeclared", {"anything": 1}) == {"anything": 1}
    with pytest.raises(InvalidParams) as refused:
        rules.parse_signal("go", {"ratio": "fast"})
    assert refused.value.message == ("The fields of the signal “go” are not valid: name: required; "
                                     "ratio: must be a number.")


def test_a_signal_needs_a_valid_name_and_a_params_model():
    with pytest.raises(ValueError, match="signal's name"):
        job_kind("test.forms.bad_name", org_states={"active"}, signals={"no spaces": Everything})
    with pytest.raises(ValueError, match="Params model"):
        job_kind("test.forms.bad_model", org_states={"active"}, signals={"go": dict})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="child-only"):
        job_kind("test.forms.child", org_states={"active"}, child_only=True, start_from_pages=True)
