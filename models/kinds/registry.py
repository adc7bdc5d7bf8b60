"""The registry of job kinds: the ``@job_kind`` decorator, and loading the kind modules."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from models.errors import UnknownKind
from models.kinds.rules import JobKind, KindRules, NoParams, Params
from models.settings import get_settings
from models.tenancy.access import ORG_STATES, ROLE_RANK

_REGISTRY: dict[str, JobKind] = {}

RunFunction = Callable[..., Any]


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
    schedule: str | None = None,
    quota: int | None = None,
    child_only: bool = False,
) -> Callable[[RunFunction], RunFunction]:
    """Register a job kind. The decorated function is ``run(ctx, params) -> result``.

    ``quota``: the most active (queued or running) jobs of this kind one organization may have,
    beside the organization's own cap; operators override it per organization
    (``spacejobs orgs set-quota ORG N --kind KIND``).
    ``child_only``: a part of a fan-out, created only by its parent's ``ctx.fan_out``. Its
    params are what the parent's code made, not what a member typed, and its result is the
    parent's to collect, so no submit (API, batch, pages, models.jobs.service, periodic jobs,
    an operator's retry) may create one: they answer ``unknown_kind``, as for a kind that does
    not exist, and the OpenAPI document does not list it.
    """
    if quota is not None and quota < 0:
        raise ValueError("a quota cannot be negative")
    if child_only and schedule is not None:
        raise ValueError("a child-only kind cannot have a schedule: only its parent starts it")
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
        schedule=schedule,
        quota=quota,
        child_only=child_only,
    )

    def register(run: RunFunction) -> RunFunction:
        _REGISTRY[name] = JobKind(rules, run)
        return run

    return register


_loaded_for: tuple[bool, bool, str] | None = None


def load_kinds() -> dict[str, JobKind]:
    """Import the built-in kinds, the bench and demo kinds when enabled, and any extra kind modules.

    Cheap to call often: the imports happen again only if the settings changed.
    """
    global _loaded_for
    settings = get_settings()
    wanted = (settings.bench_kinds, settings.demo_kinds, settings.extra_kind_modules)
    if _loaded_for == wanted:
        return _REGISTRY
    _loaded_for = wanted
    importlib.import_module("models.kinds.projects")
    if settings.bench_kinds:
        importlib.import_module("models.kinds.bench")
    if settings.demo_kinds:
        importlib.import_module("models.kinds.demo")
    for module in settings.extra_kind_module_names:
        importlib.import_module(module)
    return _REGISTRY


def required_role(name: str) -> str:
    """The role a kind needs; ``owner`` for a kind this process does not know (an old job of a
    kind since removed), so that an unknown kind fails closed."""
    found = load_kinds().get(name)
    return found.rules.role if found else "owner"


def kind_roles() -> dict[str, str]:
    """Every known kind's role, for the cancel statement (a kind it does not name needs an
    owner, as in :func:`required_role`)."""
    return {name: kind.rules.role for name, kind in load_kinds().items()}


def get_kind(name: object) -> JobKind:
    """The kind to SUBMIT a job of: every submit resolves its kind here (models.jobs.service,
    which the API, the batch and the pages go through; periodic jobs). A child-only kind is
    refused exactly as a kind that does not exist, so a member cannot even learn its name."""
    found = get_any_kind(name)
    if found.rules.child_only:
        raise UnknownKind()
    return found


def get_any_kind(name: object) -> JobKind:
    """Any registered kind, child-only ones included: for the runner, which runs whatever row it
    leased, a parent's fan-out, the one path that creates child-only jobs, and operators'
    controls of a kind."""
    if not isinstance(name, str) or name not in load_kinds():
        raise UnknownKind()
    return _REGISTRY[name]


def submittable_kinds() -> list[str]:
    """The names a submit accepts, sorted (the OpenAPI document lists these)."""
    return sorted(name for name, kind in load_kinds().items() if not kind.rules.child_only)
