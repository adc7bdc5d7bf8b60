"""Demo data for ``spacejobs demo``: two organizations, an owner "anna" and a member "vera" in
each (Acme's anna is also a member of Globex), a few projects, and an operator "olga".
Idempotent; every run gives each demo user a fresh API token and a fresh password (only hashes
are kept, so they are printed once)."""

from __future__ import annotations

import secrets
from uuid import UUID

from sqlalchemy import Connection

from spacejobs.demo.projects import Projects
from spacejobs.models.db.transaction import scope
from spacejobs.models.errors import NotFound
from spacejobs.models.tenancy import accounts, passwords

ORGS = {
    "Acme Rockets": ["Launch pad", "Fuel mix", "Telemetry", "Heat shield", "Guidance",
                     "Recovery barge", "Payload fairing", "Range safety"],
    "Globex Orbital": ["Satellite bus", "Ground station", "Solar array", "Star tracker"],
}


def _user(conn: Connection, email: str, name: str, *, operator: bool = False) -> accounts.User:
    try:
        return accounts.find_user(conn, email)
    except NotFound:
        return accounts.create_user(conn, email, name, operator=operator)


def _credentials(conn: Connection, user: accounts.User) -> dict[str, str]:
    password = secrets.token_urlsafe(9)
    passwords.set_password(conn, user.id, password)
    return {"token": accounts.create_token(conn, user.id), "password": password}


def seed(conn: Connection) -> list[dict[str, str]]:
    """Create what is missing; return each demo user with a new token and password."""
    out = []
    org_ids: dict[str, UUID] = {}
    for org_name, project_names in ORGS.items():
        slug = org_name.split()[0].lower()
        org_id = accounts.find_organization_by_name(conn, org_name)
        if org_id is None:
            org_id = accounts.create_organization(conn, org_name)
            scope(conn, organization_id=org_id, actor="demo")
            projects = Projects(conn, org_id)
            for name in project_names:
                projects.create(name, f"{name} ({org_name})")
        org_ids[org_name] = org_id
        for person, role in (("anna", "owner"), ("vera", "member")):
            user = _user(conn, f"{person}@{slug}.example", person.capitalize())
            accounts.add_member(conn, org_id, user.id, role)
            out.append({"email": user.email, "role": role, "org_name": org_name, "org_id": str(org_id),
                        **_credentials(conn, user)})
    # Acme's owner also belongs to Globex, as a plain member: the pages' organization switcher.
    accounts.add_member(conn, org_ids["Globex Orbital"],
                        accounts.find_user(conn, "anna@acme.example").id, "member")
    # An operator who belongs to no organization: sees /ops and /metrics, never tenant data.
    olga = _user(conn, "olga@ops.example", "Olga", operator=True)
    out.append({"email": olga.email, "role": "operator", "org_name": "-", "org_id": "-",
                **_credentials(conn, olga)})
    return out
