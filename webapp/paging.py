"""Keyset pagination for the API's and the pages' lists: a page is fetched with one row more
than it shows, and the cursor of the next page names the last row shown by its sort key, opaque
to the client. Most lists are newest first, keyed by a time and an id; a parent's steps are in
place order, keyed by the place.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TypeVar

from flask import request

from spacejobs.models.errors import InvalidRequest

T = TypeVar("T")
K = TypeVar("K")

MAX_LIMIT = 200


def request_limit(default: int = 50) -> int:
    """The ``limit`` query argument, bounded to 1..200."""
    try:
        return min(max(int(request.args.get("limit", str(default))), 1), MAX_LIMIT)
    except ValueError:
        raise InvalidRequest("limit must be a number.", fields=["limit"]) from None


def page_of(rows: Sequence[T], limit: int, position: Callable[[T], tuple[datetime, object]]
            ) -> tuple[list[T], str | None]:
    """The first ``limit`` of ``rows`` (fetched with ``limit + 1``), and the next page's cursor
    when there is more."""
    page = list(rows[:limit])
    return page, encode_cursor(*position(page[-1])) if len(rows) > limit else None


def encode_cursor(at: datetime, key: object) -> str:
    raw = f"{at.isoformat()}|{key}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None, key: Callable[[str], K]) -> tuple[datetime, K] | None:
    """``(at, key)`` from a cursor (``key`` parses the id: ``UUID``, ``int``); a cursor that
    does not parse is a 400."""
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, _, value = raw.partition("|")
        return datetime.fromisoformat(at), key(value)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequest("The cursor is not valid.", fields=["cursor"]) from None


#: a cursor of a list in place order (a parent's steps) says "after this place"
_PLACE = "place|"


def encode_place(place: int) -> str:
    """The cursor of the page after the step at ``place``, as opaque as the others."""
    return base64.urlsafe_b64encode(f"{_PLACE}{place}".encode()).decode().rstrip("=")


def decode_place(cursor: str | None) -> int:
    """The place a cursor of :func:`encode_place` names (-1, before the first, for none); a
    cursor that does not parse is a 400."""
    if not cursor:
        return -1
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not raw.startswith(_PLACE):
            raise ValueError("not a place cursor")
        place = int(raw.removeprefix(_PLACE))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequest("The cursor is not valid.", fields=["cursor"]) from None
    if not 0 <= place < 2**31 - 1:
        raise InvalidRequest("The cursor is not valid.", fields=["cursor"])
    return place
