"""Who may do what in an organization: membership, role and the organization's state."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol
from uuid import UUID

from sqlalchemy import Connection

from spacejobs.models.db.queries import queries_beside
from spacejobs.models.errors import (
    InsufficientRole,
    NotFound,
    OrganizationReadOnly,
    OrganizationUnavailable,
    RequesterNotMember,
)

Q = queries_beside(__file__)

ROLE_RANK = {"member": 1, "admin": 2, "owner": 3}
ORG_STATES = ("active", "read_only", "deleting", "deleted")


@dataclass(frozen=True)
class Membership:
    organization_id: UUID
    user_id: UUID
    role: str
    organization_state: str
    organization_name: str


def find_membership(conn: Connection, organization_id: UUID | str, user_id: UUID) -> Membership | None:
    """The user's current membership, read inside a transaction scoped to that organization."""
    row = conn.execute(
        Q["find_membership"], {"org": str(organization_id), "user": user_id}
    ).one_or_none()
    if row is None:
        return None
    return Membership(row.id, user_id, row.role, row.state, row.name)


def require_membership(conn: Connection, organization_id: UUID | str, user_id: UUID) -> Membership:
    """For the web: a non-member and a missing organization look the same, 404.

    A member of a ``deleted`` organization gets 409 ``organization_unavailable`` on everything
    (it knows the organization existed; it sees nothing of what is left). A ``deleting`` one may
    still be read; operations that need a live organization refuse through
    :func:`check_allowed`.
    """
    return current_member(find_membership(conn, organization_id, user_id))


def current_member(membership: Membership | None) -> Membership:
    """:func:`require_membership`'s rule, for a membership already read."""
    if membership is None:
        raise NotFound()
    if membership.organization_state == "deleted":
        raise OrganizationUnavailable()
    return membership


class Standing(Protocol):
    """What the rules look at: a membership, or a held job's requester standing."""

    @property
    def role(self) -> str: ...

    @property
    def organization_state(self) -> str: ...


def has_role(membership: Standing, role: str) -> bool:
    return ROLE_RANK[membership.role] >= ROLE_RANK[role]


def may_cancel(membership: Membership, requested_by: UUID, kind_role: str) -> bool:
    """The person who started the job may stop it; so may a member holding the kind's role.
    (What the pages offer; the cancel statement, models/jobs/store.sql, enforces the same.)

    A plain member may not cancel an admin's import (a kind that needs ``admin``), though they
    may cancel their own export.
    """
    return membership.user_id == requested_by or has_role(membership, kind_role)


def may_read_result(membership: Membership, kind_role: str) -> bool:
    """A result is as sensitive as the operation that made it: reading it needs the kind's role."""
    return has_role(membership, kind_role)


def cancel_refused(kind_role: str) -> InsufficientRole:
    """What a refused cancel says (the cancel statement applies :func:`may_cancel`'s rule)."""
    return InsufficientRole(f"Only the person who started this job, or a member with the "
                            f"{kind_role} role, may cancel it.")


def check_may_read_result(membership: Membership, kind_role: str) -> None:
    if not may_read_result(membership, kind_role):
        raise InsufficientRole(f"Reading this job's result needs the {kind_role} role.")


def check_allowed(
    membership: Standing | None,
    *,
    org_states: Iterable[str],
    role: str,
    for_worker: bool = False,
) -> None:
    """Raise the domain error that says why this membership may not run the operation."""
    if membership is None:
        raise RequesterNotMember() if for_worker else NotFound()
    if membership.organization_state not in org_states:
        if membership.organization_state == "read_only":
            raise OrganizationReadOnly()
        raise OrganizationUnavailable()
    if not has_role(membership, role):
        raise InsufficientRole()
