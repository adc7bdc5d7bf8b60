"""The demo application's tenant data: an organization's projects. Every query runs in a
tenant-scoped transaction (the web's request, or a job's ``ctx.tenant()``); the explicit
organization filter is belt and braces beside row-level security."""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from sqlalchemy import Connection

from spacejobs.models.db.queries import queries_beside
from spacejobs.models.tenancy.access import Membership, check_allowed

Q = queries_beside(__file__)


class TenantScope(Protocol):
    """A transaction scoped to one organization (a job's ``ctx.tenant()`` is one)."""

    @property
    def conn(self) -> Connection: ...

    @property
    def organization_id(self) -> UUID: ...


@dataclass(frozen=True)
class Project:
    id: UUID
    organization_id: UUID
    name: str
    description: str
    created_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "organization_id": str(self.organization_id),
            "name": self.name,
            "description": self.description,
            "created_at": self.created_at.isoformat(),
        }


class Projects:
    """Projects of the organization the connection's transaction is scoped to."""

    def __init__(self, conn: Connection, organization_id: UUID | str) -> None:
        self._conn = conn
        self._org = str(organization_id)

    @classmethod
    def of(cls, tenant: TenantScope) -> Projects:
        """The projects of a job's tenant transaction (``with ctx.tenant() as tenant``)."""
        return cls(tenant.conn, tenant.organization_id)

    def list(self, limit: int = 10_000) -> list[Project]:
        rows = self._conn.execute(Q["list"], {"org": self._org, "limit": limit})
        return [Project(*row) for row in rows]

    def get(self, project_id: UUID | str) -> Project | None:
        row = self._conn.execute(Q["get"], {"org": self._org, "id": str(project_id)}).one_or_none()
        return Project(*row) if row else None

    def create(self, name: str, description: str = "", *, created_by_job: UUID | None = None) -> Project:
        row = self._conn.execute(
            Q["create"],
            {"org": self._org, "name": name, "description": description, "job": created_by_job},
        ).one()
        return Project(*row)

    # builtins.list: inside this class, a bare ``list`` names the method above.
    def created_by_job(self, job_id: UUID) -> builtins.list[Project]:
        rows = self._conn.execute(Q["created_by_job"], {"org": self._org, "job": job_id})
        return [Project(*row) for row in rows]


def create_project(conn: Connection, membership: Membership, name: str, description: str = "") -> Project:
    """A member adds a project by hand: only an ``active`` organization takes new data
    (``organization_read_only``, ``organization_unavailable`` otherwise)."""
    check_allowed(membership, org_states={"active"}, role="member")
    return Projects(conn, membership.organization_id).create(name, description)
