"""What a job kind declares: its params schema and the rules the web and the runner enforce."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from models.errors import InvalidParams
from models.kinds.reasons import field_reasons, summary


class Params(BaseModel):
    """Base for a kind's params: plain JSON data only, unknown fields rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoParams(Params):
    pass


@dataclass(frozen=True)
class KindRules:
    name: str
    org_states: frozenset[str]
    role: str
    max_attempts: int
    backoff_base: float  # seconds before the first retry
    backoff_max: float
    lease: timedelta
    time_limit: float | None  # soft limit, seconds: TimedOut at the next checkpoint
    hard_time_limit: float | None  # seconds: the worker process is killed, the lease expires
    retry_on_timeout: bool
    dedupable: bool
    params: type[Params]
    #: when it runs by itself (models/jobs/periodic.py): cron, or "every <n><s|m|h|d>"
    schedule: str | None = None
    #: most active jobs of this kind one organization may have (None: only the organization's cap)
    quota: int | None = None
    #: only a parent's fan-out creates jobs of this kind (models/jobs/fanout.py); every submit
    #: refuses it as an unknown kind
    child_only: bool = False

    @property
    def lease_seconds(self) -> int:
        return max(1, int(self.lease.total_seconds()))

    def backoff(self, attempt: int) -> float:
        """Exponential backoff with jitter: half fixed, half random, so retries spread out."""
        ceiling = min(self.backoff_max, self.backoff_base * math.pow(2, max(attempt - 1, 0)))
        return ceiling / 2 + random.uniform(0, ceiling / 2)


@dataclass(frozen=True)
class JobKind:
    rules: KindRules
    run: Callable[..., Any]

    def parse_params(self, raw: object) -> Params:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise InvalidParams("The job parameters must be a JSON object.")
        try:
            return self.rules.params.model_validate(raw)
        except ValidationError as exc:
            # include_input=False: the values submitted never reach the error (nor a log of it)
            reasons = field_reasons(exc.errors(include_url=False, include_input=False))
            fields = sorted({r["field"] for r in reasons})
            raise InvalidParams("The job parameters are not valid: " + summary(reasons) + ".",
                                fields=fields, reasons=reasons) from None
