"""The JSON API's request bodies: strict pydantic models (unknown fields are a 400), which the
views validate with and the OpenAPI document (webapp.openapi) is generated from."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

from spacejobs.models.jobs import service

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


class BatchJob(StrictBody):
    """One job of a batch."""

    kind: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    params: dict[str, Any] | None = None
    dedup_key: Key | None = None
    run_after: Moment | None = None
    priority: Annotated[int, Field(ge=service.MIN_PRIORITY, le=service.MAX_PRIORITY, strict=True)] = 0
    #: jobs of the organization with the same key run one at a time, in submit order
    sequence_key: Annotated[str, StringConstraints(min_length=1,
                                                   max_length=service.MAX_SEQUENCE_KEY)] | None = None

    def as_request(self) -> service.JobRequest:
        """The job this body asks for, as every submit takes it (one or a batch)."""
        return service.JobRequest(self.kind, self.params, self.dedup_key, self.run_after,
                                  self.priority, self.sequence_key)


class SubmitJob(BatchJob):
    """One job."""

    #: with dedup_key: while the key's job is queued and has not started, replace its params
    #: and start it this many seconds from now (202, the same id, "debounced": true)
    debounce_seconds: Annotated[int, Field(ge=1, le=service.MAX_DEBOUNCE_SECONDS,
                                           strict=True)] | None = None

    def as_request(self) -> service.JobRequest:
        return dataclasses.replace(super().as_request(), debounce_seconds=self.debounce_seconds)


class SubmitBatch(StrictBody):
    jobs: Annotated[list[BatchJob], Field(min_length=1, max_length=service.MAX_BATCH)]


class CreateProject(StrictBody):
    name: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    description: Annotated[str, StringConstraints(max_length=2000)] = ""


