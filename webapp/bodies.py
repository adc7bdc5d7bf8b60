"""The JSON API's request bodies: strict pydantic models (unknown fields are a 400), which the
views validate with and the OpenAPI document (webapp.openapi) is generated from."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

from models.jobs import service

Key = Annotated[str, StringConstraints(min_length=1, max_length=200)]
IDEMPOTENCY_KEY = re.compile(r"[\x20-\x7e]{1,200}")


def _in_utc(value: datetime) -> datetime:
    """PostgreSQL takes UTC offsets up to 15:59 only, and no date before year 1: a time is
    stored as the UTC instant it names."""
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("the time is out of range") from None


Moment = Annotated[AwareDatetime, AfterValidator(_in_utc)]


class StrictBody(BaseModel):
    model_config = ConfigDict(extra="forbid")


BodyT = TypeVar("BodyT", bound=StrictBody)


class SubmitJob(StrictBody):
    kind: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    params: dict[str, Any] | None = None
    dedup_key: Key | None = None
    run_after: Moment | None = None
    priority: Annotated[int, Field(ge=service.MIN_PRIORITY, le=service.MAX_PRIORITY, strict=True)] = 0


class SubmitBatch(StrictBody):
    jobs: Annotated[list[SubmitJob], Field(min_length=1, max_length=service.MAX_BATCH)]


class CreateProject(StrictBody):
    name: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    description: Annotated[str, StringConstraints(max_length=2000)] = ""


