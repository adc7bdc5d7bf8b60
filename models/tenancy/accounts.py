"""Organizations, users, memberships and API tokens: what the CLI and the web's auth need.

Administrative functions run as the owner role (see
:func:`models.db.transaction.owner_transaction`); reads for a request run as the web role
inside a scoped transaction.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict
from uuid import UUID

from sqlalchemy import Connection

from spacejobs.models.db import hot
from spacejobs.models.db.queries import queries_beside
from spacejobs.models.errors import InvalidRequest, NotFound
from spacejobs.models.kinds.rules import RateLimit
from spacejobs.models.tenancy.access import Membership
from spacejobs.models.tenancy.api import Tenancy

Q = queries_beside(__file__)

TOKEN_PREFIX = "sj_"  # noqa: S105 - a public prefix, not a secret
#: what the jobs table accepts as a kind's name (its CHECK constraint)
KIND_NAME = re.compile(r"[a-z][a-z0-9_.]{0,63}")


@dataclass(frozen=True)
class User:
    id: UUID
    email: str
    name: str
    is_operator: bool


class TokenListing(TypedDict):
    """One of a user's API tokens as `tokens list` shows it (never the token: only its hash is
    stored)."""

    id: UUID
    created_at: datetime
    revoked_at: datetime | None


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def create_user(conn: Connection, email: str, name: str = "", *, operator: bool = False) -> User:
    email = email.strip().lower()
    if "@" not in email:
        raise InvalidRequest("An email address needs an @.")
    row = conn.execute(Q["create_user"], {"email": email, "name": name, "operator": operator})
    found = row.one_or_none()
    if found is None:
        raise InvalidRequest("A user with that email already exists.")
    return User(*found)


def find_user(conn: Connection, email: str) -> User:
    row = conn.execute(Q["find_user"], {"email": email.strip().lower()}).one_or_none()
    if row is None:
        raise NotFound("No user with that email.")
    return User(*row)


def get_user(conn: Connection, user_id: UUID | str) -> User | None:
    row = conn.execute(Q["get_user"], {"id": str(user_id)}).one_or_none()
    return User(*row) if row else None


def set_operator(conn: Connection, user_id: UUID, operator: bool) -> None:
    conn.execute(Q["set_operator"], {"operator": operator, "id": user_id})


def create_organization(conn: Connection, name: str) -> UUID:
    """A new organization (the CLI's, through the tenancy API an application uses too)."""
    return Tenancy(conn).put_organization(name)


def find_organization_by_name(conn: Connection, name: str) -> UUID | None:
    organization_id: UUID | None = conn.execute(
        Q["find_organization_by_name"], {"name": name}).scalar_one_or_none()
    return organization_id


def resolve_organization(conn: Connection, ref: str) -> UUID:
    """An organization by id or by (unique) name, for the CLI."""
    rows: Sequence[UUID] = conn.execute(Q["resolve_organization"], {"ref": ref}).scalars().all()
    if len(rows) != 1:
        raise NotFound("No single organization matches that id or name.")
    return rows[0]


def add_member(conn: Connection, organization_id: UUID, user_id: UUID, role: str) -> None:
    """Add a member, or change their role (through the tenancy API)."""
    Tenancy(conn).put_member(organization_id, user_id, role)


def remove_member(conn: Connection, organization_id: UUID, user_id: UUID) -> bool:
    return Tenancy(conn).remove_member(organization_id, user_id)


def set_organization_state(conn: Connection, organization_id: UUID, state: str) -> None:
    Tenancy(conn).set_state(organization_id, state)


def set_claim_weight(conn: Connection, organization_id: UUID, weight: int) -> None:
    """How big the organization's share of each claim is when several have work (default 1):
    an operator's lever for a tenant that pays for more, or one that floods."""
    if not 1 <= weight <= 100:
        raise InvalidRequest("The weight must be a whole number from 1 to 100.")
    conn.execute(Q["set_claim_weight"], {"org": organization_id, "weight": weight})


def set_quota(conn: Connection, organization_id: UUID, max_active: int | None,
              kind: str | None = None) -> None:
    """Cap the organization's active jobs (or, with ``kind``, that kind's there) at
    ``max_active``; None goes back to the default (the setting, or the kind's own quota)."""
    if max_active is not None and not 0 <= max_active <= 2**31 - 1:
        raise InvalidRequest("A quota is a whole number from 0 to 2147483647.")
    if kind is not None and not KIND_NAME.fullmatch(kind):
        raise InvalidRequest("That is not a kind's name.")
    params = {"org": organization_id, "kind": kind or "", "max_active": max_active}
    conn.execute(Q["clear_quota" if max_active is None else "set_quota"], params)


def set_rate_limit(conn: Connection, organization_id: UUID, kind: str,
                   limit: RateLimit | None) -> None:
    """At most ``limit`` of ``kind``'s jobs start in the organization in any window; None goes
    back to the kind's own limit (or none). Jobs beyond it stay queued until the window allows."""
    if not KIND_NAME.fullmatch(kind):
        raise InvalidRequest("That is not a kind's name.")
    params = {"org": organization_id, "kind": kind,
              "max_starts": limit.max_starts if limit else None,
              "per_seconds": limit.per_seconds if limit else None}
    conn.execute(Q["set_rate_limit"], params)


def create_token(conn: Connection, user_id: UUID) -> str:
    """A new API token for the user; only its hash is stored, so this is the one chance to see it."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    conn.execute(Q["create_token"], {"user": user_id, "hash": hash_token(token)})
    return token


def revoke_token(conn: Connection, ref: str) -> bool:
    """Revoke an API token named by the token itself or by its id; False if no live one matched.

    Bearer requests re-check the token every time, so the next one is refused.
    """
    ref = ref.strip()
    if ref.startswith(TOKEN_PREFIX):
        found = conn.execute(Q["revoke_token_by_hash"], {"hash": hash_token(ref)})
    else:
        try:
            token_id = UUID(ref)
        except ValueError:
            return False
        found = conn.execute(Q["revoke_token_by_id"], {"id": token_id})
    return found.rowcount > 0


def list_tokens(conn: Connection, user_id: UUID) -> list[TokenListing]:
    """The user's tokens (ids and dates, never the tokens: only hashes are stored)."""
    rows = conn.execute(Q["list_tokens"], {"user": user_id})
    return [TokenListing(id=row.id, created_at=row.created_at, revoked_at=row.revoked_at)
            for row in rows]


def principal(conn: Connection, token: str, organization_id: UUID | None = None
              ) -> tuple[User, Membership | None] | None:
    """The user behind an API token, and their membership in ``organization_id`` (None when they
    are not a member); None for an unknown or revoked token. One statement, which also scopes
    the caller's transaction to that user and (for a member) that organization."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    # Every API request's first statement: on the driver's cursor (models/db/hot.py says why).
    found = hot.rows(conn, Q["principal"], {"hash": hash_token(token), "org": organization_id})
    if not found:
        return None
    (row,) = found
    user = User(row.user_id, row.email, row.name, row.is_operator)
    membership = (Membership(row.organization_id, row.user_id, row.role, row.organization_state,
                             row.organization_name) if row.role is not None else None)
    return user, membership


def authenticate(conn: Connection, token: str) -> User | None:
    """The user behind an API token; None for an unknown or revoked one. Scopes nothing."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    row = conn.execute(Q["token_user"], {"hash": hash_token(token)}).one_or_none()
    return User(*row) if row else None


def names_of(conn: Connection, user_ids: list[UUID]) -> dict[UUID, str]:
    """How to show each user to their organization: their name, else their email."""
    rows = conn.execute(Q["names_of"], {"ids": list(set(user_ids))})
    return {row.id: row.name or row.email for row in rows}


def memberships_of(conn: Connection, user_id: UUID) -> list[dict[str, str]]:
    """The user's own memberships across organizations (needs app.user_id in scope)."""
    return [
        {"organization_id": str(r.id), "organization_name": r.name, "organization_state": r.state,
         "role": r.role}
        for r in conn.execute(Q["memberships_of"], {"user": user_id})
    ]
