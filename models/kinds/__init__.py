"""Job kinds: one decorated function per kind, with the rules the web and the runner enforce.

A kind is plain domain code: it receives a :class:`~models.context.JobContext` (tenant-scoped
transactions, progress, checkpoints) and validated params, and returns a JSON-able result. The
web reads the same rules to refuse a submit early; the runner re-checks them before and during
execution.
"""

from __future__ import annotations

import importlib
import math
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from models.access import ORG_STATES, ROLE_RANK
from models.errors import InvalidParams, UnknownKind


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

    def backoff(self, attempt: int) -> float:
        """Exponential backoff with jitter: half fixed, half random, so retries spread out."""
        ceiling = min(self.backoff_max, self.backoff_base * math.pow(2, max(attempt - 1, 0)))
        return ceiling / 2 + random.uniform(0, ceiling / 2)


@dataclass(frozen=True)
class JobKind:
    rules: KindRules
    run: Callable[..., dict[str, Any]]

    def parse_params(self, raw: object) -> Params:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise InvalidParams("The job parameters must be a JSON object.")
        try:
            return self.rules.params.model_validate(raw)
        except ValidationError as exc:
            fields = sorted({".".join(str(p) for p in err["loc"]) or "params" for err in exc.errors()})
            raise InvalidParams(
                "The job parameters are not valid: " + ", ".join(fields) + ".", fields=fields
            ) from None


_REGISTRY: dict[str, JobKind] = {}


def job_kind(
    name: str,
    *,
    org_states: set[str],
    role: str = "member",
    max_attempts: int = 3,
    backoff: float = 5.0,
    backoff_max: float = 300.0,
    lease: timedelta = timedelta(seconds=30),
    time_limit: float | None = None,
    hard_time_limit: float | None = None,
    retry_on_timeout: bool = False,
    dedupable: bool = True,
    params: type[Params] = NoParams,
) -> Callable[[Callable[..., dict[str, Any]]], Callable[..., dict[str, Any]]]:
    """Register a job kind. The decorated function is ``run(ctx, params) -> result``."""
    if not set(org_states) <= set(ORG_STATES):
        raise ValueError(f"unknown organization states in {org_states}")
    if role not in ROLE_RANK:
        raise ValueError(f"unknown role {role}")
    rules = KindRules(
        name=name,
        org_states=frozenset(org_states),
        role=role,
        max_attempts=max_attempts,
        backoff_base=backoff,
        backoff_max=backoff_max,
        lease=lease,
        time_limit=time_limit,
        # A job that ignores its soft limit (no checkpoints) is killed a little later.
        hard_time_limit=hard_time_limit or (time_limit * 1.5 + 5 if time_limit else None),
        retry_on_timeout=retry_on_timeout,
        dedupable=dedupable,
        params=params,
    )

    def register(run: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        _REGISTRY[name] = JobKind(rules, run)
        return run

    return register


_loaded_for: tuple[str | None, str | None] | None = None


def load_kinds() -> dict[str, JobKind]:
    """Import the built-in kinds, the bench kinds when enabled, and any extra kind modules.

    Cheap to call per job: the imports happen again only if the two variables changed.
    """
    global _loaded_for
    wanted = (os.environ.get("SPACEJOBS_BENCH_KINDS"), os.environ.get("SPACEJOBS_EXTRA_KIND_MODULES"))
    if _loaded_for == wanted:
        return _REGISTRY
    _loaded_for = wanted
    importlib.import_module("models.kinds.projects")
    if os.environ.get("SPACEJOBS_BENCH_KINDS") == "1":
        importlib.import_module("models.kinds.bench")
    for module in filter(None, os.environ.get("SPACEJOBS_EXTRA_KIND_MODULES", "").split(",")):
        importlib.import_module(module.strip())
    return _REGISTRY


def get_kind(name: object) -> JobKind:
    if not isinstance(name, str) or name not in load_kinds():
        raise UnknownKind()
    return _REGISTRY[name]
