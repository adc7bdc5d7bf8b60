"""Who is asking, and how: a bearer token or a web session, recorded in ``g``.

- ``g.user``: the authenticated user; ``g.auth_method``: ``"token"`` or ``"session"``.
- A bearer token opens the JSON API, the operators' JSON API and ``/metrics``.
- A web session (email + password at ``/login``) opens the pages, the operators' dashboard and
  one read-only endpoint of the JSON API: a job's events stream, because a browser's
  ``EventSource`` cannot send an ``Authorization`` header. Nothing else of the JSON API.
- A session authenticates an unsafe request (POST, …) only together with its CSRF token, and
  this is decided by how the request DID authenticate, never by which headers are present: an
  empty or malformed ``Authorization`` header is no credential at all.
- The session row is re-read on every request (models.tenancy.sessions), so a sign-out
  elsewhere, a revocation, a new password or a deleted user is out at once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from flask import current_app, g, request, session
from flask.sessions import SessionMixin
from sqlalchemy import Connection, Engine

from spacejobs.models.db.transaction import opened, transaction
from spacejobs.models.errors import InvalidRequest, NotFound, Unauthorized
from spacejobs.models.tenancy import sessions
from spacejobs.models.tenancy.access import Membership, current_member, require_membership
from spacejobs.models.tenancy.accounts import User, authenticate, principal
from spacejobs.webapp.failed_auth import count_failure, count_success

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def engine() -> Engine:
    db: Engine = current_app.extensions["spacejobs.db"]
    return db


def bearer_token() -> str | None:
    """The token of an ``Authorization: Bearer …`` header; None for no, empty or other header."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def presented_credential() -> str | None:
    """What :func:`identify` would look this request up by: its bearer token, or the session
    its cookie names (the cookie is signed: a stranger cannot make one up); None for neither."""
    token = bearer_token()
    if token is not None:
        return "token:" + token
    sid = session.get("sid")
    return "session:" + sid if isinstance(sid, str) and sid else None


def current_user(*, allow_session: bool = False) -> User:
    """The user behind the bearer token, or (``allow_session``) the web session; 401 otherwise."""
    if "user" in g:
        user: User = g.user
        return user
    found = identify(allow_session=allow_session)
    if found is None:
        raise Unauthorized()
    return remember(*found)


def page_user() -> User | None:
    """The signed-in person for the pages (sessions only, never a token), or None."""
    if "user" in g:
        return g.user if g.auth_method == "session" else None
    found = identify(allow_token=False, allow_session=True)
    return remember(*found) if found else None


def identify(*, allow_token: bool = True, allow_session: bool,
             cookie: SessionMixin | None = None) -> tuple[User, str] | None:
    """``(user, "token" | "session")`` or None. Records nothing: see :func:`remember`.

    A request that sends a bearer token is judged by that token alone: a bad token is no
    one, even when a session cookie rides along. ``cookie`` is the session to read, the
    request's own by default (see :func:`untouched_session`).
    """
    token = bearer_token() if allow_token else None
    if token is not None:
        with transaction(engine()) as conn:
            user = authenticate(conn, token)
        if user is None:
            count_failure()
            return None
        return user, "token"
    cookie = session if cookie is None else cookie
    if allow_session and cookie.get("sid"):
        with transaction(engine()) as conn:
            found = sessions.resume(conn, cookie["sid"], idle_seconds=idle_seconds())
        if found is not None:
            return found.user, "session"
        count_failure()
        cookie.clear()  # the cookie names a dead session: drop it
    return None


def untouched_session() -> SessionMixin:
    """The session as the request's cookie holds it, opened apart from the request's own, so
    that reading it (or dropping a dead one) leaves no trace in the answer: no ``Vary: Cookie``,
    no cookie written or cleared. For a refusal that must answer exactly as a URL that does not
    exist, which never looks at the session."""
    interface = current_app.session_interface
    return (interface.open_session(current_app, request)
            or interface.make_null_session(current_app))


def remember(user: User, method: str) -> User:
    """Record how this request authenticated. The one place a session is accepted for an
    unsafe method, and so the one place that insists on the CSRF token."""
    g.user, g.auth_method = user, method
    presented = presented_credential()
    if presented is not None:
        count_success(presented)
    if method == "session" and request.method not in SAFE_METHODS:
        check_csrf()
    return user


def idle_seconds() -> float:
    return float(current_app.config["SESSION_IDLE_SECONDS"])


def still_authorized() -> Callable[[Connection], bool]:
    """For a long response (the events stream): re-checks this request's credential, so a
    revoked token or session stops it at the next poll."""
    if g.auth_method == "token":
        token = bearer_token() or ""
        return lambda conn: authenticate(conn, token) is not None
    session_id, idle = session.get("sid", ""), idle_seconds()
    return lambda conn: sessions.is_live(conn, session_id, idle_seconds=idle)


# ----------------------------------------------------------------------------- sign in and out

def sign_in(user_id: uuid.UUID) -> None:
    """Start a new session (a new id: whatever the browser held before is dropped)."""
    lifetime = current_app.permanent_session_lifetime.total_seconds()
    with transaction(engine(), actor=f"user:{user_id}") as conn:
        session_id = sessions.start(conn, user_id, max_age_seconds=lifetime)
    session.clear()
    session["sid"] = session_id
    session.permanent = True


def sign_out() -> None:
    session_id = session.get("sid")
    if session_id:
        with transaction(engine()) as conn:
            sessions.revoke(conn, session_id)
    session.clear()


# ----------------------------------------------------------------------------- CSRF

def csrf_token() -> str:
    """The token every form of this browser carries: an HMAC of its session id (or, before
    sign-in, of a random value kept in the signed cookie), so a new session gets a new token
    and nothing needs storing."""
    basis = session.get("sid") or session.get("anon")
    if basis is None:
        basis = session["anon"] = secrets.token_urlsafe(16)
    key = str(current_app.config["SECRET_KEY"]).encode()
    return hmac.new(key, b"csrf:" + basis.encode(), hashlib.sha256).hexdigest()


def check_csrf() -> None:
    sent = request.form.get("csrf") or request.headers.get("X-CSRF-Token", "")
    if not sent or not hmac.compare_digest(sent, csrf_token()):
        raise InvalidRequest("This form has expired or did not come from this site; "
                             "reload the page and try again.")


# ----------------------------------------------------------------------------- organizations

def parse_id(value: str) -> uuid.UUID:
    """Ids in URLs: anything that is not a UUID is simply not found."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise NotFound() from None


@contextmanager
def org_transaction(org: str, user: User | None = None) -> Iterator[tuple[Connection, Membership]]:
    """A transaction scoped to the URL's organization, after checking current membership.

    A non-member, a removed member or a missing organization all get the same 404; a member of
    a deleted organization gets 409 ``organization_unavailable``. The user's own memberships
    are in scope too (``app.user_id``), for the organization switcher.
    """
    org_id = parse_id(org)
    token = bearer_token() if user is None and "user" not in g else None
    if token is not None:
        with _token_transaction(token, org_id) as (conn, (_, membership)):
            yield conn, current_member(membership)
        return
    user = user or current_user()
    with transaction(engine(), organization_id=org_id, user_id=user.id,
                     actor=f"user:{user.id}") as conn:
        yield conn, require_membership(conn, org_id, user.id)


@contextmanager
def user_transaction() -> Iterator[tuple[Connection, User]]:
    """A transaction scoped to the token's user alone (their own memberships are in scope),
    opened by the statement that authenticates them; 401 otherwise."""
    token = bearer_token() if "user" not in g else None
    if token is not None:
        with _token_transaction(token, None) as (conn, (user, _)):
            yield conn, user
        return
    user = current_user()
    with transaction(engine(), user_id=user.id, actor=f"user:{user.id}") as conn:
        yield conn, user


@contextmanager
def _token_transaction(token: str, org_id: uuid.UUID | None
                       ) -> Iterator[tuple[Connection, tuple[User, Membership | None]]]:
    """One statement authenticates the token, finds the membership in ``org_id`` (if named)
    and scopes the transaction to what it found (models.tenancy.accounts.principal); 401 for
    a token that is unknown or revoked."""
    with opened(engine(), lambda conn: principal(conn, token, org_id)) as (conn, found):
        if found is not None:
            remember(found[0], "token")
            yield conn, found
    if found is None:
        count_failure()  # once the connection is back in the pool
        raise Unauthorized()
