"""Bearer-token authentication and the organization a request acts in."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from flask import current_app, g, request, session
from sqlalchemy import Connection, Engine

from models.db.transaction import transaction
from models.errors import NotFound, Unauthorized
from models.tenancy.access import Membership, require_membership
from models.tenancy.accounts import User, authenticate, get_user


def engine() -> Engine:
    return current_app.extensions["spacejobs.db"]


def current_user(*, allow_session: bool = False) -> User:
    """The user behind the bearer token; 401 without a valid one.

    ``allow_session``: the dashboard also accepts the UI's session login (its forms carry a
    CSRF token); the JSON API does not, so a cookie alone can never act on tenant data.
    """
    if "user" in g:
        return g.user
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if not header and allow_session and session.get("user_id"):
        with transaction(engine()) as conn:
            user = get_user(conn, session["user_id"])
    elif scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized()
    else:
        with transaction(engine()) as conn:
            user = authenticate(conn, token.strip())
    if user is None:
        raise Unauthorized()
    g.user = user
    return user


def parse_id(value: str) -> uuid.UUID:
    """Ids in URLs: anything that is not a UUID is simply not found."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise NotFound() from None


@contextmanager
def org_transaction(org: str) -> Iterator[tuple[Connection, Membership]]:
    """A transaction scoped to the URL's organization, after checking current membership.

    A non-member, a removed member or a missing organization all get the same 404; a member of
    a deleted organization gets 409 ``organization_unavailable``.
    """
    user = current_user()
    org_id = parse_id(org)
    with transaction(engine(), organization_id=org_id, user_id=user.id,
                     actor=f"user:{user.id}") as conn:
        yield conn, require_membership(conn, org_id, user.id)
