"""Organizations, users, memberships, tokens and operators, made the way the CLI makes them.

Seeding goes through the owner role (``owner_transaction`` on an admin engine), never through
an application role: the web, the workers and the dashboard cannot create users or tokens,
and the tests must not pretend they can.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import Engine

from spacejobs.models.db.transaction import owner_transaction
from spacejobs.models.tenancy import accounts, passwords

# What job_events would name as the actor; seeding touches no job, so it is only a label.
ACTOR = "seeding"


@dataclass
class TestUser:
    """A user and the API token made for it."""

    __test__ = False  # a record, not a test class

    id: uuid.UUID
    email: str
    token: str
    password: str | None = None  # for the pages' sign-in, when a test asked for one

    @property
    def auth(self) -> dict[str, str]:
        """The headers an API request of this user carries."""
        return {"Authorization": f"Bearer {self.token}"}


@dataclass
class Tenant:
    """An organization with one member who submits its jobs (a benchmark's client)."""

    organization_id: uuid.UUID
    member: TestUser

    @property
    def user_id(self) -> uuid.UUID:
        return self.member.id

    @property
    def auth(self) -> dict[str, str]:
        return self.member.auth


def organization(admin_db: Engine, name: str | None = None, state: str = "active") -> uuid.UUID:
    with owner_transaction(admin_db, actor=ACTOR) as conn:
        org_id = accounts.create_organization(conn, name or f"org-{uuid.uuid4().hex[:6]}")
        if state != "active":
            accounts.set_organization_state(conn, org_id, state)
    return org_id


def user(admin_db: Engine, org_id: uuid.UUID | None = None, role: str = "member", *,
         email: str | None = None, password: str | None = None) -> TestUser:
    """A user with a token; a member of ``org_id`` with ``role`` when given; a password for the
    pages when asked (hashing one costs a tenth of a second, so only tests that sign in ask)."""
    email = email or f"u-{uuid.uuid4().hex[:10]}@example.test"
    with owner_transaction(admin_db, actor=ACTOR) as conn:
        made = accounts.create_user(conn, email)
        if org_id is not None:
            accounts.add_member(conn, org_id, made.id, role)
        token = accounts.create_token(conn, made.id)
        if password is not None:
            passwords.set_password(conn, made.id, password)
    return TestUser(made.id, email, token, password)


def operator(admin_db: Engine) -> TestUser:
    """A user of no organization who may use the operators' dashboard."""
    found = user(admin_db)
    with owner_transaction(admin_db, actor=ACTOR) as conn:
        accounts.set_operator(conn, found.id, True)
    return found


def tenant(admin_db: Engine, name: str) -> Tenant:
    """Organization ``name`` and one member, so a run's rows are told apart by organization.
    For benchmarks and chaos runs, which fill the queue on purpose: no quota of active jobs."""
    org_id = organization(admin_db, name)
    member = user(admin_db, org_id, "member", email=f"{name}-{uuid.uuid4().hex[:8]}@example.test")
    with owner_transaction(admin_db, actor=ACTOR) as conn:
        accounts.set_quota(conn, org_id, 2**31 - 1)
    return Tenant(org_id, member)


def set_state(admin_db: Engine, org_id: uuid.UUID, state: str) -> None:
    with owner_transaction(admin_db, actor=ACTOR) as conn:
        accounts.set_organization_state(conn, org_id, state)


def remove_member(admin_db: Engine, org_id: uuid.UUID, user_id: uuid.UUID) -> None:
    with owner_transaction(admin_db, actor=ACTOR) as conn:
        accounts.remove_member(conn, org_id, user_id)
