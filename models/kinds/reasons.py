"""Why a job's params were refused, per field, in words that never quote what was submitted.

Pydantic's own messages are not used: several of them quote the input (``uuid_parsing``'s says
which character it found where, ``timezone_offset``'s the offset given, ``union_tag_invalid``'s
the tag, ``value_error``'s and a custom error's whatever a validator wrote), and an error's
``input`` is the value itself. A reason here is built from the error's type and, for the types
listed, from those entries of its context that come from the params model (a bound, a length, a
pattern, the allowed values), never from the input. A type not listed (a validator's own
``value_error``, a custom error) says only that the value is not valid.
"""

from __future__ import annotations

from typing import Any, TypedDict

from pydantic_core import ErrorDetails

#: the reason of a type not below: it may be a validator's own message, which may quote the input
NOT_VALID = "is not valid"

#: most reasons a message spells out; the error's ``reasons`` detail has them all
MESSAGE_REASONS = 10

_OBJECT = "must be an object"
_LIST = "must be a list"
_WHOLE = "must be a whole number"
_NUMBER = "must be a number"
_DECIMAL = "must be a decimal number"
_UUID = "must be a UUID"
_DATE = "must be a date (YYYY-MM-DD)"
_DATETIME = "must be a date and time (ISO 8601)"
_TIME = "must be a time of day (HH:MM[:SS])"
_DURATION = "must be a duration (seconds or ISO 8601)"
_URL = "must be a URL"

#: error type -> reason; ``{name}`` is the error's context entry of that name (from the model)
_REASONS: dict[str, str] = {
    "missing": "required",
    "extra_forbidden": "not a parameter of this kind",
    "none_required": "must be null",
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be ≥ {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be ≤ {le}",
    "multiple_of": "must be a multiple of {multiple_of}",
    "finite_number": "must be a finite number",
    "string_type": "must be a string",
    "string_unicode": "must be a string",
    "bytes_type": "must be a string",
    "string_pattern_mismatch": "must match the pattern {pattern}",
    "string_not_ascii": "must hold only ASCII characters",
    "enum": "must be {expected}",
    "literal_error": "must be {expected}",
    "dict_type": _OBJECT,
    "mapping_type": _OBJECT,
    "model_type": _OBJECT,
    "model_attributes_type": _OBJECT,
    "dataclass_type": _OBJECT,
    "invalid_key": "must have strings as keys",
    "list_type": _LIST,
    "tuple_type": _LIST,
    "set_type": _LIST,
    "frozen_set_type": _LIST,
    "iterable_type": _LIST,
    "set_item_not_hashable": "must hold only strings, numbers, booleans or null",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "int_type": _WHOLE,
    "int_parsing": _WHOLE,
    "int_from_float": _WHOLE,
    "int_parsing_size": "is too large a number",
    "float_type": _NUMBER,
    "float_parsing": _NUMBER,
    "decimal_type": _DECIMAL,
    "decimal_parsing": _DECIMAL,
    "uuid_type": _UUID,
    "uuid_parsing": _UUID,
    "uuid_version": "must be a version {expected_version} UUID",
    "date_type": _DATE,
    "date_parsing": _DATE,
    "date_from_datetime_parsing": _DATE,
    "date_from_datetime_inexact": "must be a date without a time of day",
    "date_past": "must be in the past",
    "date_future": "must be in the future",
    "datetime_type": _DATETIME,
    "datetime_parsing": _DATETIME,
    "datetime_from_date_parsing": _DATETIME,
    "datetime_object_invalid": _DATETIME,
    "datetime_past": "must be in the past",
    "datetime_future": "must be in the future",
    "timezone_naive": "must not have a timezone",
    "timezone_aware": "must have a timezone",
    "timezone_offset": "must have the timezone offset {tz_expected}",
    "time_type": _TIME,
    "time_parsing": _TIME,
    "time_delta_type": _DURATION,
    "time_delta_parsing": _DURATION,
    "url_type": _URL,
    "url_parsing": _URL,
    "url_syntax_violation": _URL,
    "url_scheme": "must be a URL of scheme {expected_schemes}",
    "union_tag_invalid": "must have {discriminator} set to one of {expected_tags}",
    "union_tag_not_found": "must have {discriminator}",
    "recursion_loop": "must not refer to itself",
}

#: error type -> (bound, context entry, one, many): "must have at most 10 characters"
_COUNTED: dict[str, tuple[str, str, str, str]] = {
    "string_too_short": ("at least", "min_length", "character", "characters"),
    "string_too_long": ("at most", "max_length", "character", "characters"),
    "too_short": ("at least", "min_length", "item", "items"),
    "too_long": ("at most", "max_length", "item", "items"),
    "bytes_too_short": ("at least", "min_length", "byte", "bytes"),
    "bytes_too_long": ("at most", "max_length", "byte", "bytes"),
    "url_too_long": ("at most", "max_length", "character", "characters"),
    "decimal_max_digits": ("at most", "max_digits", "digit", "digits"),
    "decimal_max_places": ("at most", "decimal_places", "decimal place", "decimal places"),
    "decimal_whole_digits": ("at most", "whole_digits", "digit before the decimal point",
                             "digits before the decimal point"),
}


class FieldReason(TypedDict):
    field: str
    reason: str


def field_name(error: ErrorDetails) -> str:
    """The field an error is about, as a dotted path (``projects.3.name``); ``params`` for the
    params object itself."""
    return ".".join(str(part) for part in error["loc"]) or "params"


def reason(error: ErrorDetails) -> str:
    """Why one field was refused, from the error's type and the model's side of its context."""
    context: dict[str, Any] = dict(error.get("ctx") or {})
    counted = _COUNTED.get(error["type"])
    if counted is not None:
        bound, entry, one, many = counted
        count = context.get(entry)
        if isinstance(count, int) and not isinstance(count, bool):
            return f"must have {bound} {count} {one if count == 1 else many}"
        return NOT_VALID
    template = _REASONS.get(error["type"])
    if template is None:
        return NOT_VALID
    try:
        return template.format(**{k: _shown(v) for k, v in context.items()})
    except (KeyError, IndexError, ValueError):  # a context without the entry the type should have
        return NOT_VALID


def _shown(value: object) -> str:
    # A float field's bounds arrive as floats: 10, not 10.0, as the model's author wrote it.
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def field_reasons(errors: list[ErrorDetails]) -> list[FieldReason]:
    """One reason per field and cause, sorted by field, without repeats."""
    found = {(field_name(error), reason(error)) for error in errors}
    return [FieldReason(field=field, reason=why) for field, why in sorted(found)]


def summary(reasons: list[FieldReason]) -> str:
    """``count: must be ≤ 10; name: required``, at most :data:`MESSAGE_REASONS` of them."""
    shown = "; ".join(f"{r['field']}: {r['reason']}" for r in reasons[:MESSAGE_REASONS])
    hidden = len(reasons) - MESSAGE_REASONS
    return shown + (f"; and {hidden} more" if hidden > 0 else "")
