"""Space Jobs: durable, tenant-scoped background jobs for Flask + Celery, with PostgreSQL as the
single source of truth.

This module is the public face: what an application imports, and nothing else is promised.
Everything under ``spacejobs.*`` beside it is the house's own and may change between releases.

- Writing a kind: :func:`job_kind`, :class:`Params`, :class:`JobContext` (what a running job
  sees), :class:`Signal`, :class:`Tenant`, and the domain errors (:class:`DomainError` and its
  codes).
- Submitting and reading jobs: :func:`connect` (a script's job API), :class:`Jobs`,
  :class:`Job`, :class:`Status`, :class:`Submitted`, :class:`Outcome`, :class:`JobRequest`.
- Workflows: :func:`sig`, :func:`chain`, :func:`group`, :func:`chord`, :func:`graph`.
- Flask: :class:`SpaceJobs`, the extension (``SpaceJobs(app)`` / ``init_app``).
- Tenants: :class:`Tenancy`, an application's organizations, users and memberships.
- Tests: :mod:`spacejobs.testing`.

Names are imported when first used, so ``import spacejobs`` costs little, and a worker never
imports Flask through it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: each public name and the module that defines it
_WHERE = {
    # writing a kind
    "job_kind": "spacejobs.models.kinds",
    "Params": "spacejobs.models.kinds",
    "NoParams": "spacejobs.models.kinds",
    "JobContext": "spacejobs.tasks.engine.context",
    "Signal": "spacejobs.tasks.engine.context",
    "Tenant": "spacejobs.tasks.engine.context",
    # errors: what a kind raises, what a caller catches
    "DomainError": "spacejobs.models.errors",
    "InvalidRequest": "spacejobs.models.errors",
    "InvalidParams": "spacejobs.models.errors",
    "UnknownKind": "spacejobs.models.errors",
    "NotFound": "spacejobs.models.errors",
    "InsufficientRole": "spacejobs.models.errors",
    "RequesterNotMember": "spacejobs.models.errors",
    "OrganizationUnavailable": "spacejobs.models.errors",
    "OrganizationReadOnly": "spacejobs.models.errors",
    "DuplicateJob": "spacejobs.models.errors",
    "IdempotencyKeyReused": "spacejobs.models.errors",
    "TooManyJobs": "spacejobs.models.errors",
    "TooManySignals": "spacejobs.models.errors",
    "NoStepWaits": "spacejobs.models.errors",
    "NotResumable": "spacejobs.models.errors",
    "AlreadyResumed": "spacejobs.models.errors",
    "JobNotCompleted": "spacejobs.models.errors",
    "JobFinished": "spacejobs.models.errors",
    "ResultExpired": "spacejobs.models.errors",
    "TimedOut": "spacejobs.models.errors",
    "SignalTimeout": "spacejobs.models.errors",
    "StepsFailed": "spacejobs.tasks.engine.workflows",
    "ChildrenFailed": "spacejobs.tasks.engine.fanout",
    # the job API
    "connect": "spacejobs.tasks.client",
    "Jobs": "spacejobs.models.jobs.service",
    "Submitted": "spacejobs.models.jobs.service",
    "Outcome": "spacejobs.models.jobs.service",
    "JobRequest": "spacejobs.models.jobs.service",
    "JobRights": "spacejobs.models.jobs.service",
    "Delivered": "spacejobs.models.jobs.service",
    "Job": "spacejobs.models.jobs.records",
    "Status": "spacejobs.models.jobs.records",
    "Membership": "spacejobs.models.tenancy.access",
    # workflows
    "sig": "spacejobs.models.jobs.canvas",
    "chain": "spacejobs.models.jobs.canvas",
    "group": "spacejobs.models.jobs.canvas",
    "chord": "spacejobs.models.jobs.canvas",
    "graph": "spacejobs.models.jobs.canvas",
    # Flask
    "SpaceJobs": "spacejobs.webapp.extension",
    # tenants, and the grants an application's role needs
    "Tenancy": "spacejobs.models.tenancy.api",
    "MissingGrant": "spacejobs.models.tenancy.api",
}

#: the same names as _WHERE's, written out so that tools read them without running this
__all__ = ["AlreadyResumed", "ChildrenFailed", "Delivered", "DomainError", "DuplicateJob",
    "IdempotencyKeyReused",
    "InsufficientRole", "InvalidParams", "InvalidRequest", "Job", "JobContext", "JobFinished",
    "JobNotCompleted", "JobRequest", "JobRights", "Jobs", "Membership", "MissingGrant", "NoParams",
    "NoStepWaits", "NotFound", "NotResumable",
    "OrganizationReadOnly", "OrganizationUnavailable", "Outcome", "Params", "RequesterNotMember",
    "ResultExpired", "Signal", "SignalTimeout", "SpaceJobs", "Status", "StepsFailed", "Submitted",
    "Tenancy", "Tenant", "TimedOut", "TooManyJobs", "TooManySignals", "UnknownKind", "chain",
    "chord", "connect", "graph", "group", "job_kind", "sig"]

if TYPE_CHECKING:  # what a type checker sees; at run time, __getattr__ imports on first use
    from spacejobs.models.errors import (
        AlreadyResumed,
        DomainError,
        DuplicateJob,
        IdempotencyKeyReused,
        InsufficientRole,
        InvalidParams,
        InvalidRequest,
        JobFinished,
        JobNotCompleted,
        NoStepWaits,
        NotFound,
        NotResumable,
        OrganizationReadOnly,
        OrganizationUnavailable,
        RequesterNotMember,
        ResultExpired,
        SignalTimeout,
        TimedOut,
        TooManyJobs,
        TooManySignals,
        UnknownKind,
    )
    from spacejobs.models.jobs.canvas import chain, chord, graph, group, sig
    from spacejobs.models.jobs.records import Job, Status
    from spacejobs.models.jobs.service import (
        Delivered,
        JobRequest,
        JobRights,
        Jobs,
        Outcome,
        Submitted,
    )
    from spacejobs.models.kinds import NoParams, Params, job_kind
    from spacejobs.models.tenancy.access import Membership
    from spacejobs.models.tenancy.api import MissingGrant, Tenancy
    from spacejobs.tasks.client import connect
    from spacejobs.tasks.engine.context import JobContext, Signal, Tenant
    from spacejobs.tasks.engine.fanout import ChildrenFailed
    from spacejobs.tasks.engine.workflows import StepsFailed
    from spacejobs.webapp.extension import SpaceJobs


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'spacejobs' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # the next lookup is a plain one
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
