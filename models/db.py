"""Connections: which role connects where, and transactions scoped to a tenant.

Every transaction that touches tenant data says, inside the transaction, which organization (and
which user) it acts for, with ``set_config(..., true)``: the setting ends with the transaction,
so a pooled connection never carries one tenant's scope into the next request.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from uuid import UUID

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import URL, make_url

APP_ROLE = "space_app"
WORKER_ROLE = "space_worker"
OPERATOR_ROLE = "space_operator"
OWNER_ROLE = "space_owner"

_SQL_DIR = Path(__file__).parent / "sql"


def admin_url() -> str:
    """The URL of a role allowed to migrate and create roles (``DATABASE_URL``)."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        raise RuntimeError("DATABASE_URL is not set (spacejobs demo starts an embedded server)")
    return url


def role_url(role: str, base_url: str | None = None) -> str:
    """URL for an application role: its own variable if set, else derived from ``DATABASE_URL``.

    The derived URL keeps host, port, database and options, swaps the user, and uses
    ``SPACEJOBS_DB_ROLE_PASSWORD`` (set on the roles by ``db upgrade``) when there is one.
    """
    explicit = {
        APP_ROLE: "SPACEJOBS_APP_DATABASE_URL",
        WORKER_ROLE: "SPACEJOBS_WORKER_DATABASE_URL",
        OPERATOR_ROLE: "SPACEJOBS_OPERATOR_DATABASE_URL",
    }.get(role)
    if base_url is None and explicit and os.environ.get(explicit):
        return _driver_url(os.environ[explicit])
    base = make_url(_driver_url(base_url or admin_url()))
    # Never the admin's password: the role has its own (or none, with trust/peer auth).
    url = URL.create(base.drivername, username=role,
                     password=os.environ.get("SPACEJOBS_DB_ROLE_PASSWORD") or None,
                     host=base.host, port=base.port, database=base.database, query=base.query)
    return url.render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """The same URL in the plain form psycopg.connect() and psql take (no driver suffix)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def with_database(url: str, database: str) -> str:
    """The same server and role, another database."""
    return make_url(url).set(database=database).render_as_string(hide_password=False)


def _driver_url(url: str) -> str:
    # psycopg 3 is the only driver we ship; accept the plain scheme operators write.
    return re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql+psycopg://", url)


def make_engine(
    url: str,
    *,
    pool_size: int = 5,
    application_name: str = "spacejobs",
    statement_timeout_ms: int | None = None,
) -> Engine:
    """An engine with a small pool; ``pool_pre_ping`` lets processes ride out a database restart.

    ``statement_timeout_ms`` bounds every statement, so a web request never hangs on a locked
    or overloaded database: it answers 503 instead.
    """
    connect_args: dict[str, object] = {"application_name": application_name, "connect_timeout": 5}
    if statement_timeout_ms:
        connect_args["options"] = f"-c statement_timeout={int(statement_timeout_ms)}"
    return create_engine(
        _driver_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        pool_recycle=1800,
        connect_args=connect_args,
    )


@contextmanager
def transaction(
    engine: Engine,
    *,
    organization_id: UUID | str | None = None,
    user_id: UUID | str | None = None,
    actor: str | None = None,
) -> Iterator[Connection]:
    """One transaction, scoped to a tenant and a user when given; commits unless it raises."""
    with engine.begin() as conn:
        scope(conn, organization_id=organization_id, user_id=user_id, actor=actor)
        yield conn


def scope(
    conn: Connection,
    *,
    organization_id: UUID | str | None = None,
    user_id: UUID | str | None = None,
    actor: str | None = None,
) -> None:
    """Set the transaction-local tenant, user and actor (``SET LOCAL`` cannot bind parameters)."""
    conn.execute(
        text(
            "SELECT set_config('app.organization_id', :org, true),"
            " set_config('app.user_id', :user, true),"
            " set_config('app.actor', :actor, true)"
        ),
        {
            "org": str(organization_id) if organization_id else "",
            "user": str(user_id) if user_id else "",
            "actor": actor or "",
        },
    )


def load_queries(filename: str) -> dict[str, str]:
    """Named SQL blocks from ``models/sql/<filename>``: each starts with a ``-- name --`` line."""
    queries: dict[str, str] = {}
    name = None
    for line in (_SQL_DIR / filename).read_text().splitlines():
        header = re.fullmatch(r"--\s*([a-z_]+)\s*--\s*", line)
        if header:
            name = header.group(1)
            queries[name] = ""
        elif name is not None:
            queries[name] += line + "\n"
    return {key: value.strip() for key, value in queries.items()}


def read_sql(filename: str) -> str:
    return (_SQL_DIR / filename).read_text()
