"""Engines and URLs: a small pool per process, psycopg 3 as the only driver."""

from __future__ import annotations

import re

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url


def driver_url(url: str) -> str:
    """psycopg 3 is the only driver we ship; accept the plain scheme operators write."""
    return re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql+psycopg://", url)


def libpq_url(url: str) -> str:
    """The same URL in the plain form psycopg.connect() and psql take (no driver suffix)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def with_database(url: str, database: str) -> str:
    """The same server and role, another database."""
    return make_url(url).set(database=database).render_as_string(hide_password=False)


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
        driver_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        pool_recycle=1800,
        connect_args=connect_args,
    )
