"""What the web accepts before any view reads it: input that Python or PostgreSQL would choke on
is a 400 ``invalid_request`` here, never a 500 later.

- JSON bodies: nesting past Python's recursion limit (``RecursionError`` in the parser),
  ``NaN``/``Infinity`` and numbers that overflow to infinity (PostgreSQL's jsonb has neither),
  and strings with a NUL character or a lone surrogate (PostgreSQL text cannot hold NUL; a
  lone surrogate cannot be encoded as UTF-8) are refused as malformed.
- URLs and forms: a NUL character anywhere in the path, the query string or a form field.
- Numbers in query strings and forms: only finite values in range (:func:`bounded_float`,
  :func:`whole_number`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from flask import Flask, request
from flask.json.provider import DefaultJSONProvider

from models.errors import InvalidRequest

INT4_MAX = 2**31 - 1


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a JSON number must be finite")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _check_strings(value: Any) -> None:
    """Every string (and key) storable as PostgreSQL text: no NUL, no lone surrogate. Iterative,
    so that the check itself has no depth limit."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise ValueError("a JSON string holds a NUL character")
            item.encode("utf-8")  # UnicodeEncodeError (a ValueError) on a lone surrogate
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


class StrictJSONProvider(DefaultJSONProvider):
    """Flask's JSON, reading only what PostgreSQL can store. Every failure is a ValueError,
    which ``request.get_json(silent=True)`` turns into "no JSON object" (400)."""

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        try:
            value = json.loads(s, parse_float=_finite, parse_constant=_no_constant, **kwargs)
        except RecursionError:
            raise ValueError("JSON nested too deeply") from None
        _check_strings(value)
        return value


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
