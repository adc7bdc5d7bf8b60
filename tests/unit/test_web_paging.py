"""Keyset pages (webapp/paging.py): the cursor names the last row shown, opaque to the client,
and a cursor that does not parse is a 400, never a 500."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from flask import Flask

from spacejobs.models.errors import InvalidRequest
from spacejobs.webapp.paging import MAX_LIMIT, decode_cursor, encode_cursor, page_of, request_limit

AT = datetime(2026, 12, 1, 4, 5, 6, 789, tzinfo=UTC)


def test_a_cursor_gives_back_the_time_and_the_id_it_was_made_of():
    job_id = uuid.uuid4()
    assert decode_cursor(encode_cursor(AT, job_id), uuid.UUID) == (AT, job_id)
    assert decode_cursor(encode_cursor(AT, 12345), int) == (AT, 12345)
    other_zone = AT.astimezone(timezone(timedelta(hours=-7)))
    assert decode_cursor(encode_cursor(other_zone, 1), int)[0] == AT  # the same instant


def test_a_cursor_is_url_safe_and_carries_no_padding():
    for n in range(1, 40):  # every length of the encoded text
        cursor = encode_cursor(AT, "x" * n)
        assert "=" not in cursor and "+" not in cursor and "/" not in cursor
        assert decode_cursor(cursor, str) == (AT, "x" * n)


@pytest.mark.parametrize("cursor", [None, ""])
def test_no_cursor_is_the_first_page(cursor):
    assert decode_cursor(cursor, int) is None


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize("cursor", [
    "!!!not-base64!!!",
    "a",  # one character: no whole byte
    _b64(b"no separator at all"),
    _b64(b"yesterday|1"),
    _b64(b"2026-13-01T00:00:00+00:00|1"),
    _b64(AT.isoformat().encode() + b"|not-a-uuid"),
    _b64(AT.isoformat().encode() + b"|\xff\xfe"),
    _b64(b"\xff\xfe|1"),
])
def test_a_tampered_cursor_is_a_400_naming_the_cursor(cursor):
    with pytest.raises(InvalidRequest) as refused:
        decode_cursor(cursor, uuid.UUID)
    assert refused.value.details["fields"] == ["cursor"]
    assert refused.value.message == "The cursor is not valid."


def test_a_page_fetched_with_one_row_more_has_a_cursor_to_the_next_and_only_then():
    rows = [(AT - timedelta(seconds=n), n) for n in range(4)]  # newest first
    page, cursor = page_of(rows, 3, lambda row: row)
    assert page == rows[:3]
    assert decode_cursor(cursor, int) == rows[2]  # the last row shown, not the extra one
    last, none = page_of(rows[:3], 3, lambda row: row)
    assert last == rows[:3] and none is None
    empty, nothing = page_of([], 3, lambda row: row)
    assert empty == [] and nothing is None


@pytest.mark.parametrize(("query", "limit"), [
    ("", 50), ("?limit=10", 10), ("?limit=0", 1), ("?limit=-5", 1),
    (f"?limit={MAX_LIMIT + 1}", MAX_LIMIT), ("?limit=999999999999", MAX_LIMIT),
])
def test_the_limit_is_clamped_to_one_to_two_hundred(query, limit):
    with Flask(__name__).test_request_context("/jobs" + query):
        assert request_limit() == limit


@pytest.mark.parametrize("query", ["?limit=ten", "?limit=1.5", "?limit="])
def test_a_limit_that_is_not_a_number_is_a_400(query):
    with Flask(__name__).test_request_context("/jobs" + query), \
            pytest.raises(InvalidRequest) as refused:
        request_limit()
    assert refused.value.details["fields"] == ["limit"]


def test_the_default_limit_is_the_callers():
    with Flask(__name__).test_request_context("/audit"):
        assert request_limit(default=20) == 20
