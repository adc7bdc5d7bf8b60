"""The W3C trace context a job row keeps: only the version-00 format with non-zero ids is read
as a parent (the column's CHECK accepts nothing else either)."""

from __future__ import annotations

import uuid

import pytest

from spacejobs.models import tracing


@pytest.mark.parametrize("value", [
    None, "", "00-" + "0" * 32 + "-" + "1" * 16 + "-01", "01-" + "a" * 32 + "-" + "b" * 16 + "-01",
    "00-" + "A" * 32 + "-" + "b" * 16 + "-01", "00-" + "a" * 32 + "-" + "b" * 16 + "-01-extra"])
def test_a_malformed_traceparent_names_no_parent(value: str | None) -> None:
    assert tracing.parse_traceparent(value) is None


def test_a_traceparent_round_trips() -> None:
    written = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
    parsed = tracing.parse_traceparent(written)
    assert parsed is not None and tracing.format_traceparent(parsed) == written
