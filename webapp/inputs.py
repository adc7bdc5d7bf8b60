"""What the web accepts before any view reads it: input that Python or PostgreSQL would choke on
is a 400 ``invalid_request`` here, never a 500 later.

- JSON, wherever it enters (request bodies through the app's JSON provider, uploaded files):
  one parser, :func:`parse_json`. It refuses text that is not UTF-8, nesting past the depth
  limits of models/json_limits.py (a body as a whole: ``MAX_ENVELOPE_DEPTH``, 72 levels, so
  that a value it carries may use all of ``MAX_DEPTH``, 64, which the job API then holds it
  to; an uploaded file, which is a job's params: 64), ``NaN``/``Infinity`` and numbers that
  overflow to infinity (PostgreSQL's jsonb has neither) or have more digits than Python
  converts, an object that repeats a key (two readers could take different values), and
  strings with a NUL character or a lone surrogate (PostgreSQL text cannot hold NUL; a lone
  surrogate cannot be encoded as UTF-8).
- URLs and forms: a NUL character anywhere in the path, the query string or a form field.
- Numbers in query strings and forms: only finite values in range (:func:`bounded_float`,
  :func:`whole_number`).
"""

from __future__ import annotations

import json
import math
from datetime import date, datetime
from typing import Any

from flask import Flask, request
from flask.json.provider import DefaultJSONProvider

from spacejobs.models.errors import InvalidRequest
from spacejobs.models.json_limits import MAX_DEPTH, MAX_ENVELOPE_DEPTH, nests_past

INT4_MAX = 2**31 - 1


class MalformedJSON(ValueError):
    """A document :func:`parse_json` refuses. Its text says why in words fit for the sender
    (where, or what kind of value), never the document's content."""


class NestedTooDeep(MalformedJSON):
    """A document past its depth limit: well-formed, but refused by a rule the sender should
    be told (the app's JSON provider answers it with the limit, not as "no JSON")."""


#: what a body may carry at most, in the words of a refusal (the values, not the envelope)
BODY_TOO_DEEP = (f"The body nests arrays and objects too deeply: the values it carries (params, "
                 f"a signal's payload) may nest them at most {MAX_DEPTH} levels deep.")


def parse_json(document: str | bytes, *, max_depth: int = MAX_ENVELOPE_DEPTH) -> Any:
    """The one parser of every JSON document that enters the web; MalformedJSON for anything
    PostgreSQL could not store or Python could not handle (the module's docstring lists them),
    NestedTooDeep past ``max_depth`` levels of arrays and objects (a body's by default)."""
    try:
        text = document.decode("utf-8-sig") if isinstance(document, bytes) else document
        value = json.loads(text, parse_float=_finite, parse_int=_whole, parse_constant=_no_constant,
                           object_pairs_hook=_unique_keys)
    except MalformedJSON:
        raise
    except json.JSONDecodeError as error:
        raise MalformedJSON(f"line {error.lineno}, column {error.colno}") from None
    except UnicodeDecodeError:
        raise MalformedJSON("it is not UTF-8 text") from None
    except RecursionError:  # far past any limit: Python's own parser gave up first
        raise NestedTooDeep(_nested_past(max_depth)) from None
    except ValueError:
        raise MalformedJSON("it cannot be read") from None
    if nests_past(value, max_depth):
        raise NestedTooDeep(_nested_past(max_depth))
    _check_strings(value)
    return value


def _nested_past(limit: int) -> str:
    return f"it nests arrays and objects more than {limit} levels deep"


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise MalformedJSON("a number is too large")
    return value


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # more digits than sys.get_int_max_str_digits()
        raise MalformedJSON("a number is too large") from None


def _no_constant(name: str) -> Any:
    raise MalformedJSON(f"{name} is not a JSON value")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        raise MalformedJSON("an object repeats a key")
    return value


def _check_strings(value: Any) -> None:
    """Every string (and key) storable as PostgreSQL text: no NUL, no lone surrogate. Iterative,
    so that the check itself has no depth limit."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise MalformedJSON("a string holds a NUL character")
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise MalformedJSON("a string holds a lone surrogate") from None
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


def _iso_dates(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return DefaultJSONProvider.default(value)


class StrictJSONProvider(DefaultJSONProvider):
    """Flask's JSON, read by :func:`parse_json`. Its failures are ValueErrors, which
    ``request.get_json(silent=True)`` turns into "no JSON object" (400), but for a body nested
    too deep: that is InvalidRequest (400 ``invalid_request``), saying the limit, on every
    route alike.

    It writes every date in ISO 8601 (``2026-12-06T08:42:14.123456+00:00``), as the tenant API
    always has: Flask's default writes a ``datetime`` as RFC 1123 (``Sun, 06 Dec 2026 08:42:14
    GMT``), to the second and without its offset, which the operators' API once answered."""

    default = staticmethod(_iso_dates)

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        if kwargs:
            raise TypeError("the strict JSON parser takes no options")
        try:
            return parse_json(s)
        except NestedTooDeep:
            raise InvalidRequest(BODY_TOO_DEEP, fields=["body"]) from None


def install(app: Flask) -> None:
    app.json = StrictJSONProvider(app)

    @app.before_request
    def refuse_nul_characters() -> None:
        # The path too, whatever the route: a NUL must answer the same 400 on every URL
        # (a 404 here and a 400 there would tell a stranger which URLs exist under /ops).
        values = [request.path, *request.args.keys(), *request.args.values()]
        if request.mimetype in ("application/x-www-form-urlencoded", "multipart/form-data"):
            values += [*request.form.keys(), *request.form.values()]
        if any("\x00" in value for value in values):
            raise InvalidRequest("The request holds a NUL character.")


def bounded_float(raw: str, name: str, *, low: float, high: float) -> float:
    """A finite number in [low, high] from a query string or form field, else 400."""
    try:
        value = float(raw)
    except (ValueError, OverflowError):
        value = math.nan
    if not low <= value <= high:  # NaN fails both comparisons
        raise InvalidRequest(f"{name} must be a number from {low:g} to {high:g}.", fields=[name])
    return value


def whole_number(raw: object, name: str, *, low: int = 0, high: int = INT4_MAX) -> int:
    """A whole number in [low, high] from JSON (an integer) or a form field (digits), else 400."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str) and raw.strip().isascii() and raw.strip().isdigit() \
            and len(raw.strip()) <= 12:
        value = int(raw.strip())
    else:
        value = low - 1
    if not low <= value <= high:
        raise InvalidRequest(f"{name} must be a whole number from {low} to {high}.", fields=[name])
    return value
