"""``spacejobs db upgrade``: roles first (cluster-wide, as the admin), then Alembic as the owner.

Idempotent and safe to run from several hosts at once: role creation tolerates a concurrent
creator, and Alembic runs under an advisory lock.
"""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, text

from models.db import APP_ROLE, OPERATOR_ROLE, OWNER_ROLE, WORKER_ROLE, make_engine

_MIGRATIONS = Path(__file__).parent / "migrations"
_LOCK_KEY = 0x5BACE0B5  # pg_advisory_xact_lock key for migrations

# None of these may bypass row-level security, and none is a superuser.
_ROLES = {
    OWNER_ROLE: "NOLOGIN",
    APP_ROLE: "LOGIN",
    WORKER_ROLE: "LOGIN",
    OPERATOR_ROLE: "LOGIN",
}


def upgrade(admin_url: str, revision: str = "head") -> None:
    """Create or update the roles, then migrate the schema to ``revision`` as the owner role."""
    engine = make_engine(admin_url, pool_size=1, application_name="spacejobs-migrate")
    try:
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
            _ensure_roles(conn)
            conn.execute(text(f"SET LOCAL ROLE {OWNER_ROLE}"))
            config = Config()
            config.set_main_option("script_location", str(_MIGRATIONS))
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
    finally:
        engine.dispose()


def _ensure_roles(conn: Connection) -> None:
    password = os.environ.get("SPACEJOBS_DB_ROLE_PASSWORD")
    for role, login in _ROLES.items():
        conn.execute(
            text(
                "DO $$ BEGIN "
                f"CREATE ROLE {role} {login}; "
                "EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
            )
        )
        conn.execute(text(f"ALTER ROLE {role} {login} NOSUPERUSER NOBYPASSRLS NOCREATEROLE NOCREATEDB"))
        if password and login == "LOGIN":
            # ALTER ROLE takes no bind parameters; quote the literal on the server.
            quoted = conn.execute(text("SELECT quote_literal(:p)"), {"p": password}).scalar_one()
            conn.execute(text(f"ALTER ROLE {role} PASSWORD {quoted}"))
    # The admin must be able to SET ROLE to the owner; the owner creates the schema objects.
    conn.execute(text(f"GRANT {OWNER_ROLE} TO current_user"))
    conn.execute(text(f"GRANT USAGE, CREATE ON SCHEMA public TO {OWNER_ROLE}"))
    for role in (APP_ROLE, WORKER_ROLE, OPERATOR_ROLE):
        conn.execute(text(f"GRANT USAGE ON SCHEMA public TO {role}"))
