"""The registry of job kinds: the ``@job_kind`` decorator, and loading the kind modules.

The registry is a module-level dict on purpose: kinds register themselves when their module is
imported, as Celery's tasks and Flask's blueprints do, so a kind module needs no wiring of its
own; :func:`load_kinds` is the one place that imports them."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from types import MappingProxyType, SimpleNamespace
from typing import Any

from spacejobs.models.errors import UnknownKind
from spacejobs.models.kinds.rules import (
    SIGNAL_NAME,
    JobKind,
    KindRules,
    NoParams,
    Params,
    RateLimit,
    label_from_name,
)
from spacejobs.models.settings import get_settings
from spacejobs.models.tenancy.access import ORG_STATES, ROLE_RANK

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
    params: type[Params] | None = None,
    schedule: str | None = None,
    quota: int | None = None,
    child_only: bool = False,
    rate_limit: str | None = None,
    label: str | None = None,
    description: str | None = None,
    start_from_pages: bool = False,
    signals: Mapping[str, type[Params]] | None = None,
) -> Callable[[RunFunction], RunFunction]:
    """Register a job kind. The decorated function is ``run(ctx, params) -> result``.

    ``params``: the kind's :class:`Params` model. Without it, the type hint of ``run``'s second
    parameter is the model (``def run(ctx: JobContext, params: MyParams)``); with neither, the
    kind takes no params. A hint that is not a ``Params`` model, or that names another model
    than ``params``, is refused here, at import, rather than found when a submit is refused.

    ``quota``: the most active (queued or running) jobs of this kind one organization may have,
    beside the organization's own cap; operators override it per organization
    (``spacejobs orgs set-quota ORG N --kind KIND``).
    ``rate_limit``: at most this many of the kind's jobs start in one organization in any
    window, ``"10 per minute"`` or ``"50 per 10 seconds"``; the rest stay queued, in order, until
    the window lets them start. Operators override it per organization
    (``spacejobs orgs set-rate-limit ORG KIND "N per S seconds"``).
    ``label``: what people call it (the pages' buttons, titles and lists; without one, words
    made from the name); ``description``: one sentence on its card of the Jobs page.
    ``start_from_pages``: members start it from the Jobs page, with a form made from its params
    model (each field's type, default, title and description; a model too rich for a form,
    with lists or objects, takes a JSON file of the params instead), by the same rules as any
    submit. ``signals``: the signals its jobs take, by name, each with the :class:`Params` model
    its payload must fit (the API and the pages refuse one that does not, as they refuse
    params); a waiting job's page offers them to whoever may signal it.
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
    if child_only and start_from_pages:
        raise ValueError("a child-only kind cannot be started from the pages: only its parent starts it")
    for signal, model in (signals or {}).items():
        if not SIGNAL_NAME.fullmatch(signal):
            raise ValueError(f"job kind {name!r}: a signal's name is 1 to 64 letters, digits, "
                             f"'.', '_' or '-', not {signal!r}")
        if not (isinstance(model, type) and issubclass(model, Params)):
            raise ValueError(f"job kind {name!r}: the signal {signal!r} needs a Params model")
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
        params=params or NoParams,
        schedule=schedule,
        quota=quota,
        child_only=child_only,
        rate_limit=RateLimit.parse(rate_limit) if rate_limit is not None else None,
        label=label,
        description=description,
        start_from_pages=start_from_pages,
        signals=MappingProxyType(dict(signals or {})),
    )

    def register(run: RunFunction) -> RunFunction:
        model = _params_model(name, run, params)
        _REGISTRY[name] = JobKind(dataclasses.replace(rules, params=model), run)
        return run

    return register


def _params_model(kind: str, run: RunFunction, given: type[Params] | None) -> type[Params]:
    """The params model of ``kind``: ``given`` (``params=``), else the hint of ``run``'s params."""
    hint = _params_hint(kind, run, resolvable=given is None)
    if hint is None or hint is Any:
        return given or NoParams
    if not (isinstance(hint, type) and issubclass(hint, Params)):
        raise ValueError(f"job kind {kind!r}: the params of {run.__qualname__} are hinted as "
                         f"{_describe(hint)}, which is not a Params model (a subclass of "
                         "spacejobs.models.kinds.Params)")
    if given is not None and hint is not given:
        raise ValueError(f"job kind {kind!r}: params={given.__qualname__} but {run.__qualname__}"
                         f"'s params are hinted as {hint.__qualname__}; give one model")
    return hint


def _params_hint(kind: str, run: RunFunction, *, resolvable: bool) -> object:
    """The resolved type hint of ``run``'s second parameter, or None when it has none.

    Only that one hint is resolved, so that the context's hint may name a class imported under
    ``TYPE_CHECKING``. A hint that cannot be resolved (a class local to a function, under
    ``from __future__ import annotations``) is an error only when it is the only source of the
    model (``resolvable``).
    """
    try:
        parameters = list(inspect.signature(run).parameters.values())
    except (TypeError, ValueError):  # a builtin or C callable: no signature to read
        return None
    positional = [p for p in parameters
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 2 or positional[1].annotation is inspect.Parameter.empty:
        return None
    unwrapped = inspect.unwrap(run)
    holder = SimpleNamespace(__annotations__={"params": positional[1].annotation})
    try:
        return typing.get_type_hints(holder, globalns=getattr(unwrapped, "__globals__", {}))["params"]
    except Exception as error:  # NameError, or a SyntaxError/TypeError of a malformed hint
        if not resolvable:
            return None
        raise ValueError(f"job kind {kind!r}: the type hint {positional[1].annotation!r} of "
                         f"{run.__qualname__}'s params cannot be resolved "
                         f"({type(error).__name__}); define the model at module level or pass "
                         "params=") from None


def _describe(hint: object) -> str:
    return hint.__qualname__ if isinstance(hint, type) else repr(hint)


def load_kinds(modules: Sequence[str] | None = None) -> Mapping[str, JobKind]:
    """Import the kind modules (each registers its kinds with ``@job_kind``) and return every
    registered kind. Each process's start calls it once (the web's create_app, the worker's
    Celery app, a script's ``spacejobs.connect()``), with the settings' modules when none are
    named (``SPACEJOBS_KIND_MODULES`` and the rest, models.settings); the registry itself knows
    no concrete kind and imports nothing on a lookup."""
    for module in get_settings().kind_module_names if modules is None else modules:
        importlib.import_module(module)
    return registered_kinds()


def registered_kinds() -> Mapping[str, JobKind]:
    """The kinds registered so far, by name (read-only)."""
    return MappingProxyType(_REGISTRY)


def label_of(name: str) -> str:
    """What people call the kind ``name``: its declared label, else words made from its name
    (an old job of a kind this process no longer loads too)."""
    found = _REGISTRY.get(name)
    return found.rules.shown_label if found else label_from_name(name)


def startable_kinds() -> list[JobKind]:
    """The kinds members start from the Jobs page, in the order they were declared."""
    return [k for k in _REGISTRY.values() if k.rules.start_from_pages and not k.rules.child_only]


def required_role(name: str) -> str:
    """The role a kind needs; ``owner`` for a kind this process does not know (an old job of a
    kind since removed), so that an unknown kind fails closed."""
    found = _REGISTRY.get(name)
    return found.rules.role if found else "owner"


def kind_roles() -> dict[str, str]:
    """Every known kind's role, for the cancel statement (a kind it does not name needs an
    owner, as in :func:`required_role`)."""
    return {name: kind.rules.role for name, kind in _REGISTRY.items()}


def get_kind(name: object) -> JobKind:
    """The kind to SUBMIT a job of: every submit resolves its kind here (models.jobs.service,
    which the API, the batch and the pages go through; periodic jobs). A child-only kind is
    refused exactly as a kind that does not exist, so a member cannot even learn its name."""
    found = get_any_kind(name)
    if found.rules.child_only:
        raise unknown_kind(name)
    return found


def get_any_kind(name: object) -> JobKind:
    """Any registered kind, child-only ones included: for the runner, which runs whatever row it
    leased, a parent's fan-out, the one path that creates child-only jobs, and operators'
    controls of a kind."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise unknown_kind(name)
    return _REGISTRY[name]


#: what a kind's name may look like, for a refusal to quote it back
_NAME_SHOWN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")


def unknown_kind(name: object) -> UnknownKind:
    """The refusal of a kind that is not registered (or is child-only: the same words), naming
    it when it reads as a kind's name could: the caller's own word, shown so that a typo or a
    kind this deployment does not load (the benchmarks') is found at once. Anything else is
    not repeated."""
    if isinstance(name, str) and _NAME_SHOWN.fullmatch(name):
        return UnknownKind(f"There is no job of the kind “{name}”.")
    return UnknownKind()


def submittable_kinds() -> list[str]:
    """The names a submit accepts, sorted (the OpenAPI document lists these)."""
    return sorted(name for name, kind in _REGISTRY.items() if not kind.rules.child_only)
