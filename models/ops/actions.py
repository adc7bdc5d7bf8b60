"""What operators do to kinds: pause and resume one, limit its concurrency, limit its starts in
one organization (a rate limit); and the operator
audit log every operator action writes in its own transaction (an operator's cancel or retry of
a job is a job operation: models.jobs.service.Jobs)."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from psycopg.errors import ForeignKeyViolation
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import IntegrityError

from spacejobs.models.db.queries import queries_beside
from spacejobs.models.db.transaction import transaction
from spacejobs.models.errors import InvalidRequest
from spacejobs.models.kinds import RateLimit, get_any_kind

Q = queries_beside(__file__)

KEEP = object()  # set_kind_control: leave the concurrency limit as it is


def audit(conn: Connection, operator_id: UUID, action: str, target: str,
          detail: dict[str, Any], request_id: str | None) -> None:
    """One line of the operator audit log, in the caller's transaction."""
    conn.execute(Q["audit"], {"operator": operator_id, "action": action, "target": target,
                              "detail": json.dumps(detail), "request_id": request_id})


def no_such_organization() -> InvalidRequest:
    """The refusal of an operator action that names an organization that does not exist."""
    return InvalidRequest("There is no organization with that id.", fields=["organization_id"])


#: the foreign key that refuses a rate limit of an organization deleted meanwhile
_RATE_LIMIT_ORGANIZATION = "job_rate_limits_organization_id_fkey"


def set_rate_limit(app_db: Engine, organization_id: UUID, kind: str, limit: RateLimit | None, *,
                   operator_id: UUID, request_id: str | None = None) -> None:
    """At most ``limit`` of ``kind``'s jobs start in the organization (None: back to the kind's
    own limit, if it declares one). Written to the operator audit log in the same statement.

    An organization that does not exist is refused (:func:`no_such_organization`) and nothing
    is written, not even the audit line of a removal: checked in the same transaction before
    the change, and, for one deleted between the check and the change, by the foreign key that
    then refuses the rate limit."""
    get_any_kind(kind)
    try:
        # Scoped to the organization: the web role sees one only so (row-level security).
        with transaction(app_db, organization_id=organization_id,
                         actor=f"operator:{operator_id}") as conn:
            if conn.execute(Q["organization_exists"], {"id": organization_id}).first() is None:
                raise no_such_organization()
            conn.execute(Q["set_rate_limit"], {
                "operator": operator_id, "organization_id": organization_id, "kind": kind,
                "max_starts": limit.max_starts if limit else None,
                "per_seconds": limit.per_seconds if limit else None, "request_id": request_id})
    except IntegrityError as error:
        if not isinstance(error.orig, ForeignKeyViolation) \
                or error.orig.diag.constraint_name != _RATE_LIMIT_ORGANIZATION:
            raise
        raise no_such_organization() from None


def set_kind_control(app_db: Engine, kind: str, *, operator_id: UUID, paused: bool | None = None,
                     concurrency_limit: int | object | None = KEEP,
                     request_id: str | None = None) -> None:
    """Pause/resume a kind or set its global concurrency limit (None removes the limit)."""
    get_any_kind(kind)  # operators pause and limit child-only kinds too
    if isinstance(concurrency_limit, int) and concurrency_limit < 0:
        raise InvalidRequest("A concurrency limit cannot be negative.")
    with transaction(app_db, actor=f"operator:{operator_id}") as conn:
        conn.execute(Q["ensure_kind_settings"], {"kind": kind, "operator": operator_id})
        detail: dict[str, Any] = {}
        if paused is not None:
            conn.execute(Q["set_paused"], {"paused": paused, "operator": operator_id, "kind": kind})
            detail["paused"] = paused
        if concurrency_limit is not KEEP:
            conn.execute(Q["set_concurrency_limit"],
                         {"limit": concurrency_limit, "operator": operator_id, "kind": kind})
            detail["concurrency_limit"] = concurrency_limit
        audit(conn, operator_id, "kind_control", kind, detail, request_id)
