"""Job kinds: one decorated function per kind, with the rules the web and the runner enforce.

A kind is plain domain code: it receives a :class:`~models.jobs.context.JobContext`
(tenant-scoped transactions, progress, checkpoints) and validated params, and returns a
JSON-able result. The web reads the same rules to refuse a submit early; the runner re-checks
them before and during execution.
"""

from spacejobs.models.kinds.registry import (
    get_any_kind,
    get_kind,
    job_kind,
    kind_roles,
    label_of,
    load_kinds,
    registered_kinds,
    required_role,
    startable_kinds,
    submittable_kinds,
)
from spacejobs.models.kinds.rules import SIGNAL_NAME, JobKind, KindRules, NoParams, Params, RateLimit

__all__ = ["SIGNAL_NAME", "JobKind", "KindRules", "NoParams", "Params", "RateLimit", "get_any_kind",
           "get_kind", "job_kind", "kind_roles", "label_of", "load_kinds", "registered_kinds",
           "required_role", "startable_kinds", "submittable_kinds"]
