"""The PostgreSQL and Redis a test session or a benchmark runs against.

``DATABASE_URL``/``REDIS_URL`` when both are set (CI: the machine's own servers), otherwise an
embedded PostgreSQL and Redis (``webapp.embedded``) started for this process. Every user of
the servers works in databases of its own: the schema is migrated once into a template
database, and each stack clones it (a file copy, much faster than migrating again).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from spacejobs.models.db.engine import libpq_url, with_database


@dataclass
class Servers:
    """A PostgreSQL server (through a role allowed to create databases) and a Redis."""

    admin_url: str  # a superuser (or CREATEDB + CREATEROLE) URL on the maintenance database
    redis_url: str  # in kombu's spelling (``redis+socket://`` for a unix socket)
    source: str  # where they came from, for a report's header
    embedded: Any = None  # webapp.embedded.EmbeddedServers, when we started them
    _template: str | None = field(default=None, repr=False)

    def create_database(self, name: str, template: str | None = None) -> str:
        """Create ``name`` (a copy of ``template`` if given); returns its admin URL."""
        with psycopg.connect(libpq_url(self.admin_url), autocommit=True) as conn:
            if template:
                conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
            else:
                conn.execute(f'CREATE DATABASE "{name}"')
        url = with_database(self.admin_url, name)
        if template:
            # What upgrade() does to a database that CREATE DATABASE does not copy (no TEMP).
            from spacejobs.models.db.engine import make_engine
            from spacejobs.models.db.migrate import secure_database

            engine = make_engine(url, pool_size=1)
            try:
                with engine.begin() as admin:
                    secure_database(admin)
            finally:
                engine.dispose()
        return url

    def drop_database(self, name: str) -> None:
        # FORCE: a worker killed a moment ago may still hold a connection the server has not
        # noticed yet.
        with psycopg.connect(libpq_url(self.admin_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def migrated_template(self) -> str:
        """The name of a database holding the current schema, made on first use."""
        if self._template is None:
            from spacejobs.models.db.migrate import upgrade

            name = f"sj_tpl_{uuid.uuid4().hex[:10]}"
            upgrade(self.create_database(name))
            self._template = name
        return self._template

    def postgres_version(self) -> str:
        with psycopg.connect(libpq_url(self.admin_url)) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return row[0] if row else "?"

    def close(self) -> None:
        """Drop the template and stop embedded servers; servers found in the environment stay."""
        try:
            if self._template is not None:
                self.drop_database(self._template)
                self._template = None
        finally:
            if self.embedded is not None:
                self.embedded.stop()
                self.embedded = None


def find_or_start(data_dir: Path | None = None) -> Servers:
    """The servers named by ``DATABASE_URL``/``REDIS_URL``, else embedded ones (for whichever
    of the two is not set) under ``data_dir``, or a new temporary directory: a short path,
    because PostgreSQL's unix socket lives there."""
    database_url, redis_url = os.environ.get("DATABASE_URL"), os.environ.get("REDIS_URL")
    if database_url and redis_url:
        return Servers(database_url, redis_url, "DATABASE_URL / REDIS_URL")
    from spacejobs.webapp import embedded as embedded_servers

    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="spacejobs-servers-"))
    embedded = embedded_servers.start(data_dir, ephemeral=True)
    source = "embedded (webapp.embedded)" if not (database_url or redis_url) else "partly embedded"
    return Servers(database_url or embedded.admin_url, redis_url or embedded.redis_url, source,
                   embedded=embedded)
