"""``spacejobs db upgrade``: roles first (cluster-wide, as the admin), then Alembic as the owner.

Idempotent and safe to run from several hosts at once: role creation tolerates a concurrent
creator, and Alembic runs under an advisory lock. The revisions under ``migrations/versions``
are frozen history; ``schema.sql`` beside this module is the same schema as one reviewed file,
and ``tests/integration/test_migrations.py`` proves the two agree.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection

from models.db.engine import make_engine
from models.db.queries import queries_beside
from models.db.roles import APP_ROLE, OPERATOR_ROLE, WORKER_ROLE, role_password

Q = queries_beside(__file__)
MIGRATIONS = Path(__file__).parent / "migrations"


def upgrade(admin_url: str, revision: str = "head") -> None:
    """Create or update the roles, then migrate the schema to ``revision`` as the owner role."""
    engine = make_engine(admin_url, pool_size=1, application_name="spacejobs-migrate")
    try:
        with engine.begin() as conn:
            conn.execute(Q["lock"])
            ensure_roles(conn)
            conn.execute(Q["set_owner_role"])
            config = Config()
            config.set_main_option("script_location", str(MIGRATIONS))
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
    finally:
        engine.dispose()


def ensure_roles(conn: Connection) -> None:
    conn.execute(Q["pass_role_passwords"],
                 {role: role_password(role) or "" for role in (APP_ROLE, WORKER_ROLE, OPERATOR_ROLE)})
    conn.execute(Q["ensure_roles"])
    conn.execute(Q["grant_schema"])
