"""Demo data for ``spacejobs demo``: two organizations, an owner "anna" and a member "vera" in
each, a few projects. Idempotent; fresh tokens every run (only their hashes are kept)."""

from __future__ import annotations

from sqlalchemy import Connection

from models.db.transaction import scope
from models.errors import NotFound
from models.tenancy import accounts
from models.tenancy.projects import Projects

ORGS = {
    "Acme Rockets": ["Launch pad", "Fuel mix", "Telemetry"],
    "Globex Orbital": ["Satellite bus", "Ground station"],
}


def _user(conn: Connection, email: str, name: str, *, operator: bool = False) -> accounts.User:
    try:
        return accounts.find_user(conn, email)
    except NotFound:
        return accounts.create_user(conn, email, name, operator=operator)


def seed(conn: Connection) -> list[dict[str, str]]:
    """Create what is missing; return each demo user with a new token."""
    out = []
    for org_name, project_names in ORGS.items():
        slug = org_name.split()[0].lower()
        org_id = accounts.find_organization_by_name(conn, org_name)
        if org_id is None:
            org_id = accounts.create_organization(conn, org_name)
            scope(conn, organization_id=org_id, actor="demo")
            projects = Projects(conn, org_id)
            for name in project_names:
                projects.create(name, f"{name} ({org_name})")
        for person, role in (("anna", "owner"), ("vera", "member")):
            user = _user(conn, f"{person}@{slug}.example", person.capitalize())
            accounts.add_member(conn, org_id, user.id, role)
            out.append({"email": user.email, "role": role, "org_name": org_name, "org_id": str(org_id),
                        "token": accounts.create_token(conn, user.id)})
    # An operator who belongs to no organization: sees /ops and /metrics, never tenant data.
    olga = _user(conn, "olga@ops.example", "Olga", operator=True)
    out.append({"email": olga.email, "role": "operator", "org_name": "-", "org_id": "-",
                "token": accounts.create_token(conn, olga.id)})
    return out
