"""The four PostgreSQL roles, and the URL each process connects with.

None of the roles is a superuser or may bypass row-level security. ``space_owner`` owns the
schema (NOLOGIN: the admin in ``DATABASE_URL`` migrates through ``SET ROLE``); the web, the
workers and the dashboard each connect as their own role.
"""

from __future__ import annotations

from pydantic import SecretStr
from sqlalchemy.engine import URL, make_url

from spacejobs.models.db.engine import driver_url, libpq_url
from spacejobs.models.settings import get_settings

OWNER_ROLE = "space_owner"
APP_ROLE = "space_app"
WORKER_ROLE = "space_worker"
OPERATOR_ROLE = "space_operator"


def admin_url() -> str:
    """The URL of a role allowed to migrate and create roles (``DATABASE_URL``)."""
    url = get_settings().database_url
    if not url:
        raise RuntimeError("DATABASE_URL is not set (spacejobs demo starts an embedded server)")
    return url


def role_url(role: str, base_url: str | None = None) -> str:
    """URL for an application role: its own setting if given, else derived from ``DATABASE_URL``.

    The derived URL keeps host, port, database and options, swaps the user, and uses
    the role's password (set on it by ``db upgrade``, see ``role_password``) when there is one.
    """
    explicit, _ = _own_settings(role)
    if base_url is None and explicit:
        return driver_url(explicit)
    base = make_url(driver_url(base_url or admin_url()))
    # Never the admin's password: the role has its own (or none, with trust/peer auth).
    url = URL.create(base.drivername, username=role, password=role_password(role),
                     host=base.host, port=base.port, database=base.database, query=base.query)
    return url.render_as_string(hide_password=False)


def listen_url(url: str) -> str | None:
    """Where a process that connects with ``url`` LISTENs (libpq form), or None: not at all.

    A LISTEN must stay on its own server connection for as long as it listens, which a
    transaction-mode pooler cannot give: through PgBouncer it hears nothing, and the LISTEN
    stays behind on a server connection that other clients then share. So behind such a
    pooler only ``SPACEJOBS_LISTEN_DATABASE_URL`` (a direct server) is used; without it the
    callers do without (the worker's linger is off, ``Jobs.wait`` re-reads the row).
    """
    settings = get_settings()
    if settings.listen_database_url:
        direct = make_url(driver_url(settings.listen_database_url))
        own = make_url(driver_url(url))
        return libpq_url(own.set(host=direct.host, port=direct.port, database=direct.database,
                                 query=direct.query).render_as_string(hide_password=False))
    if settings.db_pooler == "transaction":
        return None
    return libpq_url(url)


def role_password(role: str) -> str | None:
    """The password ``db upgrade`` sets on a login role: its own setting, else the shared one.

    Separate passwords let each deployed service hold only its own role's secret.
    """
    _, own = _own_settings(role)
    secret = own or get_settings().db_role_password
    if secret is None:
        return None
    return secret.get_secret_value() or None


def _own_settings(role: str) -> tuple[str | None, SecretStr | None]:
    """A login role's own URL and password settings (both unset for any other role)."""
    settings = get_settings()
    return {
        APP_ROLE: (settings.app_database_url, settings.app_db_password),
        WORKER_ROLE: (settings.worker_database_url, settings.worker_db_password),
        OPERATOR_ROLE: (settings.operator_database_url, settings.operator_db_password),
    }.get(role, (None, None))
