"""``spacejobs db upgrade``: roles first (cluster-wide, as the admin), then the schema as the owner.

Idempotent and safe to run from several hosts at once: role creation tolerates a concurrent
creator, and the schema step runs under an advisory lock.

Two ways to the same schema, in one transaction each:

- a fresh database (no ``alembic_version`` table) runs the files of ``schema/``, the whole
  current schema split by concern, in the order of their two-digit prefixes (``00_`` first), and
  is stamped at the newest revision;
- an existing database is upgraded revision by revision through ``migrations/versions``.

The revisions are frozen history: ``migrations/versions/FROZEN`` holds the sha256 of each file
and ``tests/unit/test_frozen_revisions.py`` fails when one changes. Each function lives in
exactly one schema file, its REVOKE/GRANT lines right below it. To change the schema:

1. add ``00NN_name.sql`` with the change, and ``00NN_name.py`` (copy the newest revision; set
   ``revision``/``down_revision``; its ``upgrade()`` runs only its own ``.sql`` file). A revision
   adds or replaces whole objects, the fewest that make one change: to change a function it
   carries that function's complete new text (``CREATE OR REPLACE``, or ``DROP`` + ``CREATE`` and
   its grants again when the signature or the argument names change), never other functions'.
   It copies the text rather than reading the schema file: a revision must do forever what it
   did the day it was frozen, and the schema files keep changing;
2. make the same change in the one schema file that holds the object (a new object goes in the
   file of its concern, after what it needs, before what needs it: a file sees only the files
   numbered below it);
3. run ``pytest tests/unit/test_frozen_revisions.py``: it prints the manifest lines to add;
4. run ``pytest tests/integration/test_migrations.py``: it diffs the catalogs of a database
   built each way (function bodies to the letter) and prints any difference.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, text

from spacejobs.models.db.engine import make_engine
from spacejobs.models.db.queries import queries_beside
from spacejobs.models.db.roles import APP_ROLE, OPERATOR_ROLE, WORKER_ROLE, role_password
from spacejobs.models.ops import quota_policy, retention
from spacejobs.models.settings import get_settings

Q = queries_beside(__file__)
MIGRATIONS = Path(__file__).parent / "migrations"
SCHEMA = Path(__file__).parent / "schema"


def schema_files() -> list[Path]:
    """The schema's files in the order a fresh database runs them: by their two-digit prefix."""
    files = sorted(SCHEMA.glob("[0-9][0-9]_*.sql"))
    if not files:  # an install without its package data must not be stamped as built
        raise FileNotFoundError(f"no schema files in {SCHEMA}")
    return files


def upgrade(admin_url: str, revision: str = "head", *, replay_revisions: bool = False) -> None:
    """Create or update the roles, then bring the schema to ``revision`` as the owner role.

    Args:
        admin_url: a role that may create roles and that may ``SET ROLE space_owner``.
        revision: the Alembic revision to reach. ``schema/`` is only ever the newest, so a
            fresh database is built from it only when this is ``"head"``.
        replay_revisions: build a fresh database revision by revision too, as an existing one
            is upgraded (the migration test compares the two).
    """
    engine = make_engine(admin_url, pool_size=1, application_name="spacejobs-migrate")
    try:
        with engine.begin() as conn:
            conn.execute(Q["lock"])
            ensure_roles(conn)
            conn.execute(Q["set_owner_role"])
            config = alembic_config(conn)
            fresh = not conn.execute(Q["has_alembic_version"]).scalar_one()
            if fresh and revision == "head" and not replay_revisions:
                # text(), like the revisions' op.execute: one multi-statement script a file.
                for path in schema_files():
                    conn.execute(text(path.read_text()))
                command.stamp(config, "head")
            else:
                command.upgrade(config, revision)
            if revision == "head":
                # the deployment's SPACEJOBS_KEEP_* ages and SPACEJOBS_ACTIVE_JOBS_QUOTA, where
                # set, become the database's policies
                retention.apply_settings(conn, get_settings())
                quota_policy.apply_settings(conn, get_settings())
    finally:
        engine.dispose()


def alembic_config(conn: Connection) -> Config:
    """Alembic on our own connection, so it joins the caller's transaction (migrations/env.py)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = conn
    return config


def ensure_roles(conn: Connection) -> None:
    conn.execute(Q["pass_role_passwords"],
                 {role: role_password(role) or "" for role in (APP_ROLE, WORKER_ROLE, OPERATOR_ROLE)})
    conn.execute(Q["ensure_roles"])
    conn.execute(Q["grant_schema"])
    secure_database(conn)


def secure_database(conn: Connection) -> None:
    """Database-wide settings only the database's owner may make (here: no TEMP for anyone).
    A database cloned from a template needs them again: CREATE DATABASE does not copy them."""
    conn.execute(Q["secure_database"])
