"""Demo data for ``spacejobs demo``: two organizations, an owner "anna" and a member "vera" in
each, a few projects. Idempotent; fresh tokens every run (only their hashes are kept)."""

from __future__ import annotations

from sqlalchemy import Connection, text

from models import tenancy
from models.db import scope
from models.errors import NotFound
from models.projects import Projects

ORGS = {
    "Acme Rockets": ["Launch pad", "Fuel mix", "Telemetry"],
    "Globex Orbital": ["Satellite bus", "Ground station"],
}


def seed(conn: Connection) -> list[dict[str, str]]:
    """Create what is missing; return each demo user with a new token."""
    out = []
    for org_name, project_names in ORGS.items():
        slug = org_name.split()[0].lower()
        org_id = conn.execute(
            text("SELECT id FROM organizations WHERE name = :name"), {"name": org_name}
        ).scalar_one_or_none()
        if org_id is None:
            org_id = tenancy.create_organization(conn, org_name)
            scope(conn, organization_id=org_id, actor="demo")
            projects = Projects(conn, org_id)
            for name in project_names:
                projects.create(name, f"{name} ({org_name})")
        for person, role in (("anna", "owner"), ("vera", "member")):
            email = f"{person}@{slug}.example"
            try:
                user = tenancy.find_user(conn, email)
            except NotFound:
                user = tenancy.create_user(conn, email, person.capitalize())
            tenancy.add_member(conn, org_id, user.id, role)
            out.append({"email": email, "role": role, "org_name": org_name, "org_id": str(org_id),
                        "token": tenancy.create_token(conn, user.id)})
    # An operator who belongs to no organization: sees /ops and /metrics, never tenant data.
    try:
        olga = tenancy.find_user(conn, "olga@ops.example")
    except NotFound:
        olga = tenancy.create_user(conn, "olga@ops.example", "Olga", operator=True)
    out.append({"email": olga.email, "role": "operator", "org_name": "-", "org_id": "-",
                "token": tenancy.create_token(conn, olga.id)})
    return out
