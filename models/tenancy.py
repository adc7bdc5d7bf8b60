"""Organizations, users, memberships and API tokens: what the CLI and the web's auth need.

Administrative functions run as the owner role (see :func:`owner_transaction`); reads for a
request run as the web role inside a scoped transaction.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from uuid import UUID

from sqlalchemy import Connection, Engine, text

from models.access import ORG_STATES, ROLE_RANK
from models.db import OWNER_ROLE, scope
from models.errors import InvalidRequest, NotFound

TOKEN_PREFIX = "sj_"  # noqa: S105 - a public prefix, not a secret


@dataclass(frozen=True)
class User:
    id: UUID
    email: str
    name: str
    is_operator: bool


@contextmanager
def owner_transaction(engine: Engine, *, actor: str = "cli") -> Iterator[Connection]:
    """A transaction as the owner role, from an admin connection (``DATABASE_URL``)."""
    with engine.begin() as conn:
        conn.execute(text(f"SET LOCAL ROLE {OWNER_ROLE}"))
        scope(conn, actor=actor)
        yield conn


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def create_user(conn: Connection, email: str, name: str = "", *, operator: bool = False) -> User:
    email = email.strip().lower()
    if "@" not in email:
        raise InvalidRequest("An email address needs an @.")
    row = conn.execute(
        text(
            "INSERT INTO users (email, name, is_operator) VALUES (:email, :name, :op)"
            " ON CONFLICT (email) DO NOTHING RETURNING id, email, name, is_operator"
        ),
        {"email": email, "name": name, "op": operator},
    ).one_or_none()
    if row is None:
        raise InvalidRequest("A user with that email already exists.")
    return User(*row)


def find_user(conn: Connection, email: str) -> User:
    row = conn.execute(
        text("SELECT id, email, name, is_operator FROM users WHERE email = :email"),
        {"email": email.strip().lower()},
    ).one_or_none()
    if row is None:
        raise NotFound("No user with that email.")
    return User(*row)


def create_organization(conn: Connection, name: str) -> UUID:
    return conn.execute(
        text("INSERT INTO organizations (name) VALUES (:name) RETURNING id"), {"name": name}
    ).scalar_one()


def resolve_organization(conn: Connection, ref: str) -> UUID:
    """An organization by id or by (unique) name, for the CLI."""
    rows = conn.execute(
        text("SELECT id FROM organizations WHERE id::text = :ref OR name = :ref"), {"ref": ref}
    ).scalars().all()
    if len(rows) != 1:
        raise NotFound("No single organization matches that id or name.")
    return rows[0]


def add_member(conn: Connection, organization_id: UUID, user_id: UUID, role: str) -> None:
    if role not in ROLE_RANK:
        raise InvalidRequest("The role must be owner, admin or member.")
    conn.execute(
        text(
            "INSERT INTO memberships (organization_id, user_id, role) VALUES (:org, :user, :role)"
            " ON CONFLICT (organization_id, user_id) DO UPDATE SET role = excluded.role"
        ),
        {"org": organization_id, "user": user_id, "role": role},
    )


def remove_member(conn: Connection, organization_id: UUID, user_id: UUID) -> bool:
    result = conn.execute(
        text("DELETE FROM memberships WHERE organization_id = :org AND user_id = :user"),
        {"org": organization_id, "user": user_id},
    )
    return result.rowcount > 0


def set_organization_state(conn: Connection, organization_id: UUID, state: str) -> None:
    if state not in ORG_STATES:
        raise InvalidRequest("The state must be one of: " + ", ".join(ORG_STATES) + ".")
    conn.execute(
        text("UPDATE organizations SET state = :state, updated_at = now() WHERE id = :org"),
        {"org": organization_id, "state": state},
    )


def create_token(conn: Connection, user_id: UUID) -> str:
    """A new API token for the user; only its hash is stored, so this is the one chance to see it."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    conn.execute(
        text("INSERT INTO api_tokens (user_id, token_hash) VALUES (:user, :hash)"),
        {"user": user_id, "hash": hash_token(token)},
    )
    return token


def authenticate(conn: Connection, token: str) -> User | None:
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    row = conn.execute(
        text(
            "SELECT u.id, u.email, u.name, u.is_operator FROM api_tokens t"
            " JOIN users u ON u.id = t.user_id"
            " WHERE t.token_hash = :hash AND t.revoked_at IS NULL"
        ),
        {"hash": hash_token(token)},
    ).one_or_none()
    return User(*row) if row else None


def get_user(conn: Connection, user_id: UUID | str) -> User | None:
    row = conn.execute(
        text("SELECT id, email, name, is_operator FROM users WHERE id = CAST(:id AS uuid)"),
        {"id": str(user_id)},
    ).one_or_none()
    return User(*row) if row else None


def set_operator(conn: Connection, user_id: UUID, operator: bool) -> None:
    conn.execute(text("UPDATE users SET is_operator = :op WHERE id = :id"),
                 {"op": operator, "id": user_id})


def memberships_of(conn: Connection, user_id: UUID) -> list[dict[str, str]]:
    """The user's own memberships across organizations (needs app.user_id in scope)."""
    rows = conn.execute(
        text(
            "SELECT o.id, o.name, o.state, m.role FROM memberships m"
            " JOIN organizations o ON o.id = m.organization_id"
            " WHERE m.user_id = :user ORDER BY o.name, o.id"
        ),
        {"user": user_id},
    )
    return [
        {"organization_id": str(r.id), "organization_name": r.name, "organization_state": r.state,
         "role": r.role}
        for r in rows
    ]
