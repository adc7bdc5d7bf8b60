"""An application's tenants in Space Jobs: its organizations, users and memberships, written in
the application's OWN transaction (its Flask-SQLAlchemy ``db.session``, or a connection), so that
a member removed in the application and in Space Jobs is one commit.

Space Jobs knows a tenant as an *organization* and a person as a *user*, each with a UUID. An
application maps its own to them: the easiest way is an id it derives from its own key
(:meth:`Tenancy.id_for`, a UUID5: the same key gives the same id in every process, with nothing
to store), or it keeps the ids Space Jobs made in a column of its own. Every write goes through
a SECURITY DEFINER function granted to ``space_tenancy`` (models/db/schema/25_tenancy_api.sql),
so the application's database role needs ``GRANT space_tenancy TO <role>`` (and ``space_app``
to submit and read jobs): docs/guides/adding-to-your-flask-app.md.

What happens to jobs: a member removed, or an organization made ``read_only``, ``deleting`` or
``deleted``, is re-checked by the worker before a job runs and before its writes commit (under
a lock the removal waits for): a queued job of a removed member fails ``requester_not_member``,
a running one stops at its next tenant transaction or its finish; a job of a kind that a state
no longer allows fails ``organization_read_only`` or ``organization_unavailable``.
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol
from uuid import UUID

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError

from spacejobs.models.db.queries import queries_beside
from spacejobs.models.errors import InvalidRequest, NotFound
from spacejobs.models.tenancy.access import ORG_STATES, ROLE_RANK

Q = queries_beside(__file__)

#: the role an application's database role must hold to write its tenants
TENANCY_ROLE = "space_tenancy"


class HasConnection(Protocol):
    """A SQLAlchemy Session (Flask-SQLAlchemy's ``db.session``): its current transaction's
    connection is the one written through."""

    def connection(self) -> Connection: ...


class MissingGrant(RuntimeError):
    """The application's database role lacks a role Space Jobs needs; the message says which
    GRANT to run."""


def connection_of(target: Connection | HasConnection) -> Connection:
    """The connection of a Session's current transaction, or the connection itself."""
    return target if isinstance(target, Connection) else target.connection()


class Tenancy:
    """Write an application's organizations, users and memberships in its own transaction::

        tenancy = Tenancy(db.session)
        org = tenancy.put_organization("Acme", id=Tenancy.id_for("team", team.id))
        user = tenancy.put_user(person.email, name=person.name, id=Tenancy.id_for("user", person.id))
        tenancy.put_member(org, user, "admin")
        db.session.commit()   # the application's rows and Space Jobs' together, or neither
    """

    #: the namespace of :meth:`id_for`'s ids (a fixed UUID: the same key, the same id, anywhere)
    NAMESPACE = UUID("6f3c5b1e-2d8a-4c57-9a3e-1b7d0c9e4f21")

    def __init__(self, target: Connection | HasConnection) -> None:
        self._target = target

    @classmethod
    def id_for(cls, kind: str, key: object) -> UUID:
        """A stable UUID for one of the application's own tenants or users: ``kind`` says which
        table ("team", "user"), ``key`` is its own id."""
        return uuid.uuid5(cls.NAMESPACE, f"{kind}:{key}")

    def put_organization(self, name: str, *, id: UUID | None = None) -> UUID:
        """Make an organization (with ``id``, or a new one), or rename it; its id."""
        if not isinstance(name, str) or not 1 <= len(name) <= 200:
            raise InvalidRequest("An organization's name is 1 to 200 characters.", fields=["name"])
        made: UUID = self._call("put_organization", {"id": id, "name": name}).scalar_one()
        return made

    def set_state(self, organization_id: UUID, state: str) -> None:
        """``active``, ``read_only`` (its members read, export; nothing new), ``deleting`` or
        ``deleted`` (nothing runs). NotFound for an organization that does not exist."""
        if state not in ORG_STATES:
            raise InvalidRequest(f"An organization's state is one of {', '.join(ORG_STATES)}.",
                                 fields=["state"])
        if not self._call("set_organization_state", {"id": organization_id, "state": state}
                          ).scalar_one():
            raise NotFound()

    def put_user(self, email: str, *, name: str = "", id: UUID | None = None) -> UUID:
        """Make a user (with ``id``, or a new one), or change its email and name; its id. An
        email another user has is InvalidRequest."""
        if not isinstance(email, str) or "@" not in email or len(email) > 320:
            raise InvalidRequest("A user's email is an address with an @.", fields=["email"])
        try:
            made: UUID = self._call("put_user", {"id": id, "email": email, "name": name}).scalar_one()
        except IntegrityError:
            raise InvalidRequest("Another user has this email.", fields=["email"]) from None
        return made

    def put_member(self, organization_id: UUID, user_id: UUID, role: str) -> None:
        """Make the user a member of the organization with ``role`` (owner, admin, member), or
        change their role."""
        if role not in ROLE_RANK:
            raise InvalidRequest(f"A role is one of {', '.join(ROLE_RANK)}.", fields=["role"])
        try:
            self._call("put_membership", {"org": organization_id, "user": user_id, "role": role})
        except IntegrityError:
            raise NotFound() from None  # the organization or the user does not exist

    def remove_member(self, organization_id: UUID, user_id: UUID) -> bool:
        """The user leaves the organization (their queued jobs then fail requester_not_member);
        False when they were not a member."""
        removed: bool = self._call("remove_membership", {"org": organization_id,
                                                         "user": user_id}).scalar_one()
        return removed

    def _call(self, name: str, params: dict[str, Any]) -> Any:
        conn = connection_of(self._target)
        try:
            return conn.execute(Q[name], params)
        except DBAPIError as error:
            if getattr(error.orig, "sqlstate", None) == "42501":  # insufficient_privilege
                role = conn.engine.url.username or "<the role of its database URL>"
                raise MissingGrant(
                    f"The database role {role!r} may not write Space Jobs' tenants: run "
                    f"GRANT {TENANCY_ROLE} TO {role} (as the database's owner or admin).") from None
            raise
