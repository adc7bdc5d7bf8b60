"""Server-side web sessions: a browser holds a random id, the database holds its SHA-256.

Every request resumes the session from its row (:func:`resume`), so signing out, a revocation by
an operator, a new password or a deleted user take effect on the very next request. A session
ends after ``idle`` without a request, or at ``expires_at`` (fixed at sign-in) whatever happens.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from sqlalchemy import Connection

from spacejobs.models.db.queries import queries_beside
from spacejobs.models.tenancy.accounts import User, hash_token

Q = queries_beside(__file__)


@dataclass(frozen=True)
class WebSession:
    user: User
    auth_method: str
    created_at: datetime
    expires_at: datetime


def start(conn: Connection, user_id: UUID, *, max_age_seconds: float, auth_method: str = "password") -> str:
    """A new session for the user; returns the id for the cookie (only its SHA-256 is stored, as
    for API tokens).

    The user's dead sessions (ended a day ago or more) are deleted on the way, so the table
    holds about one row per signed-in browser without a sweeper of its own.
    """
    conn.execute(Q["forget_dead"], {"user": user_id})
    session_id = secrets.token_urlsafe(32)
    conn.execute(Q["start"], {"hash": hash_token(session_id), "user": user_id, "method": auth_method,
                              "max_age": max_age_seconds})
    return session_id


def resume(conn: Connection, session_id: str, *, idle_seconds: float) -> WebSession | None:
    """The live session behind the cookie, marked as seen; None if it is unknown, revoked,
    idle too long, past its absolute end, or its user is gone."""
    if not session_id or len(session_id) > 100:
        return None
    row = conn.execute(Q["resume"], {"hash": hash_token(session_id), "idle": idle_seconds}).one_or_none()
    if row is None:
        return None
    return WebSession(User(row.id, row.email, row.name, row.is_operator), row.auth_method,
                      row.created_at, row.expires_at)


def is_live(conn: Connection, session_id: str, *, idle_seconds: float) -> bool:
    """Whether :func:`resume` would still accept the session, without marking it seen."""
    found = conn.execute(Q["is_live"], {"hash": hash_token(session_id), "idle": idle_seconds})
    return found.first() is not None


def revoke(conn: Connection, session_id: str) -> None:
    """Sign out this browser (the web role, on /logout)."""
    conn.execute(Q["revoke"], {"hash": hash_token(session_id)})


def revoke_all(conn: Connection, user_id: UUID) -> int:
    """Sign the user out everywhere (owner role: ``users set-password``, ``users sign-out``)."""
    return conn.execute(Q["revoke_all"], {"user": user_id}).rowcount
