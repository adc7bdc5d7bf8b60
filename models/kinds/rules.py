"""What a job kind declares: its params schema and the rules the web and the runner enforce."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from spacejobs.models.errors import InvalidParams
from spacejobs.models.kinds.reasons import field_reasons, summary


class Params(BaseModel):
    """Base for a kind's params: plain JSON data only, unknown fields rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoParams(Params):
    pass


#: a signal's name (the job_signals CHECK says the same)
SIGNAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

#: the bounds the database holds a rate limit to (job_rate_limits' CHECKs)
MAX_STARTS_LIMIT, MAX_WINDOW_SECONDS = 10_000, 86_400
_UNIT_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86_400}
_RATE = re.compile(r"\s*(\d+)\s+per\s+(?:(\d+)\s+)?(second|minute|hour|day)s?\s*")


@dataclass(frozen=True)
class RateLimit:
    """At most ``max_starts`` jobs start in any ``per_seconds`` (a sliding window), per
    organization and kind."""

    max_starts: int
    per_seconds: int

    @classmethod
    def parse(cls, text: str) -> RateLimit:
        """``"10 per minute"``, ``"50 per 10 seconds"``, ``"1000 per 2 hours"``; ValueError
        with what is wrong otherwise."""
        found = _RATE.fullmatch(text)
        if not found:
            raise ValueError('a rate limit reads "N per minute" or "N per S seconds" '
                             "(second, minute, hour or day)")
        count, units = int(found[1]), int(found[2] or 1)
        limit = cls(count, units * _UNIT_SECONDS[found[3]])
        if not 1 <= limit.max_starts <= MAX_STARTS_LIMIT:
            raise ValueError(f"a rate limit lets 1 to {MAX_STARTS_LIMIT:,} jobs start per window")
        if not 1 <= limit.per_seconds <= MAX_WINDOW_SECONDS:
            raise ValueError("a rate limit's window is 1 second to 1 day")
        return limit

    def __str__(self) -> str:
        return f"{self.max_starts} per {self.per_seconds} seconds"


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
    #: at most this many jobs of the kind start per window in one organization (None: no limit
    #: unless an operator sets one, ``spacejobs orgs set-rate-limit``)
    rate_limit: RateLimit | None = None
    #: what people call it: the pages' buttons, titles and lists (None: :attr:`shown_label`)
    label: str | None = None
    #: one sentence for people: what a job of the kind does, on its card of the Jobs page
    description: str | None = None
    #: members start it from the Jobs page, with a form made from its params model (by the
    #: same rules as any submit: its organization states and role)
    start_from_pages: bool = False
    #: the signals its jobs take, each with the model its payload must fit; a waiting job's
    #: page offers them to the members who may send them (the API's rule)
    signals: Mapping[str, type[Params]] = field(default_factory=dict)

    @property
    def shown_label(self) -> str:
        """The label, or one made from the name (``thumbs.make`` → "Thumbs make")."""
        return self.label or label_from_name(self.name)

    def parse_signal(self, name: str, payload: object) -> object:
        """A signal's payload checked against the model the kind declares for it, refused with
        the same words as a job's params (:meth:`JobKind.parse_params`); a signal the kind does
        not declare is taken as it is (a workflow's, a kind that declares none)."""
        model = self.signals.get(name)
        if model is None:
            return payload
        return validate(model, {} if payload is None else payload,
                        f"The fields of the signal “{name}”").model_dump(mode="json")

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
        return validate(self.rules.params, {} if raw is None else raw, "The job parameters")


def validate(model: type[Params], raw: object, what: str) -> Params:
    """``raw`` as ``model``, or InvalidParams saying which fields and why, never quoting them."""
    if not isinstance(raw, dict):
        raise InvalidParams(f"{what} must be a JSON object.")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        # include_input=False: the values submitted never reach the error (nor a log of it)
        reasons = field_reasons(exc.errors(include_url=False, include_input=False))
        fields = sorted({r["field"] for r in reasons})
        raise InvalidParams(f"{what} are not valid: " + summary(reasons) + ".",
                            fields=fields, reasons=reasons) from None


def label_from_name(name: str) -> str:
    """A kind's name as words: ``thumbs.make`` → "Thumbs make", ``projects_export`` →
    "Projects export"."""
    words = name.replace(".", " ").replace("_", " ").split()
    return " ".join(words).capitalize() if words else name
