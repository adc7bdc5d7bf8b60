"""A form made from a params model (a kind's params, a signal's payload), and the values a
person typed, as the model's JSON.

The form follows the model's JSON schema, field by field: a whole number or a number (with the
model's bounds), true or false (a checkbox), one of fixed values (a list), or a line of text;
each with its title, description, default and whether it is required. A model with any other
field (a list, an object) is too rich for a form: the page takes a JSON file of it instead.
What the person typed goes to the model as it is, as text (pydantic reads ``"20"`` as 20 for a
number field), so a refusal is the model's, in the same words as the API's, and the page shows
the form again with what they typed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

#: JSON schema types a field of a form may have, and the input each one is
_INPUTS = {"integer": "number", "number": "number", "boolean": "checkbox", "string": "text"}
#: a string longer than this is typed in a box of several lines
LONG_TEXT = 200


@dataclass(frozen=True)
class FormField:
    name: str
    title: str
    input: str  # number, checkbox, text, textarea or select
    required: bool
    default: str | None  # as the input shows it (None: no default)
    description: str | None
    choices: tuple[str, ...] = ()
    minimum: str | None = None
    maximum: str | None = None
    step: str | None = None  # "1" for a whole number, "any" for a number


@dataclass(frozen=True)
class Form:
    """The fields of a model's form; ``rich``: the model has fields no input holds, so its
    values come as a JSON file instead."""

    fields: tuple[FormField, ...]
    rich: bool


def form_of(model: type[BaseModel]) -> Form:
    schema = model.model_json_schema()
    required = set(schema.get("required", ()))
    fields = []
    for name, spec in schema.get("properties", {}).items():
        made = _field(name, _without_null(spec), name in required)
        if made is None:
            return Form((), rich=True)
        fields.append(made)
    return Form(tuple(fields), rich=False)


def _without_null(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """``X | None`` is a field of X that may be left empty."""
    options = spec.get("anyOf")
    if options:
        kept = [o for o in options if o.get("type") != "null"]
        if len(kept) == 1:
            return {**spec, **kept[0], "anyOf": None}
    return spec


def _field(name: str, spec: Mapping[str, Any], required: bool) -> FormField | None:
    title = str(spec.get("title") or name.replace("_", " ").capitalize())
    description = spec.get("description")
    default = spec.get("default")
    shown_default = None if default is None else _shown(default)
    choices = spec.get("enum")
    if choices is None and "const" in spec:
        choices = [spec["const"]]
    if choices is not None:
        if not all(isinstance(c, str) for c in choices):
            return None
        return FormField(name, title, "select", required, shown_default, description,
                         tuple(choices))
    kind = spec.get("type")
    if kind not in _INPUTS:
        return None  # a list, an object, a union: not a field of a form
    if kind == "string" and spec.get("format") not in (None, "uuid", "date", "date-time", "uri"):
        return None
    if kind in ("integer", "number"):
        low = spec.get("minimum", spec.get("exclusiveMinimum"))
        high = spec.get("maximum", spec.get("exclusiveMaximum"))
        return FormField(name, title, "number", required, shown_default, description,
                         minimum=None if low is None else _shown(low),
                         maximum=None if high is None else _shown(high),
                         step="1" if kind == "integer" else "any")
    long_text = kind == "string" and int(spec.get("maxLength") or LONG_TEXT + 1) > LONG_TEXT
    return FormField(name, title, "textarea" if long_text else _INPUTS[kind], required,
                     shown_default, description)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def typed_values(form: Form, typed: Mapping[str, str]) -> dict[str, Any]:
    """What the person typed into ``form``, for the model to validate: a field left empty is
    left out (its default applies, or the model says it is required), a checkbox is true or
    false, anything else the text as typed."""
    values: dict[str, Any] = {}
    for field in form.fields:
        if field.input == "checkbox":
            values[field.name] = field.name in typed
            continue
        text = typed.get(field.name, "")
        if text.strip() == "":
            continue
        values[field.name] = text
    return values
