"""Database URLs (models/db/engine.py, models/db/roles.py): one driver whatever the operator
wrote, the same server under another role or database, and no admin password handed on."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from spacejobs.models.db.engine import driver_url, libpq_url, with_database
from spacejobs.models.db.roles import OWNER_ROLE, WORKER_ROLE, admin_url, role_password, role_url
from spacejobs.models.settings import reload_settings


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in ("SPACEJOBS_DB_ROLE_PASSWORD", "SPACEJOBS_WORKER_DB_PASSWORD",
                 "SPACEJOBS_WORKER_DATABASE_URL", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    reload_settings()
    yield monkeypatch
    monkeypatch.undo()
    reload_settings()


@pytest.mark.parametrize("written", [
    "postgres://u:p@h:5/d", "postgresql://u:p@h:5/d", "postgresql+psycopg2://u:p@h:5/d",
    "postgresql+psycopg://u:p@h:5/d", "postgres+asyncpg://u:p@h:5/d",
])
def test_every_spelling_of_a_postgresql_url_gets_psycopg_3(written):
    assert driver_url(written) == "postgresql+psycopg://u:p@h:5/d"


def test_only_the_scheme_is_rewritten():
    assert driver_url("postgresql://u@h/d?application_name=postgres://x") == (
        "postgresql+psycopg://u@h/d?application_name=postgres://x")


def test_libpq_takes_the_plain_scheme_and_keeps_the_password():
    assert libpq_url("postgresql+psycopg://u:p%40ss@h:5432/d?sslmode=require") == (
        "postgresql://u:p%40ss@h:5432/d?sslmode=require")


def test_another_database_on_the_same_server_and_role():
    assert with_database("postgresql+psycopg://u:p@h:5432/space?sslmode=require", "template1") == (
        "postgresql+psycopg://u:p@h:5432/template1?sslmode=require")


def test_without_database_url_the_admin_url_is_a_clear_error(env):
    with pytest.raises(RuntimeError, match="DATABASE_URL is not set"):
        admin_url()


def test_a_roles_explicit_url_wins_unless_a_base_is_given(env):
    env.setenv("SPACEJOBS_WORKER_DATABASE_URL", "postgres://space_worker:own@replica/space")
    env.setenv("DATABASE_URL", "postgresql://admin:adminpw@primary/space")
    reload_settings()
    assert role_url(WORKER_ROLE) == "postgresql+psycopg://space_worker:own@replica/space"
    derived = role_url(WORKER_ROLE, "postgresql://admin:adminpw@other/space")
    assert derived == "postgresql+psycopg://space_worker@other/space"
    assert "adminpw" not in derived  # never the admin's password


def test_the_owner_role_has_no_password_of_its_own(env):
    env.setenv("SPACEJOBS_DB_ROLE_PASSWORD", "shared")
    reload_settings()
    assert role_password(WORKER_ROLE) == "shared"
    assert role_password(OWNER_ROLE) == "shared"  # NOLOGIN: whatever it gets is never used
    env.setenv("SPACEJOBS_WORKER_DB_PASSWORD", "")
    reload_settings()
    assert role_password(WORKER_ROLE) == "shared"  # an empty own password is no password


def test_an_empty_shared_password_is_none(env):
    env.setenv("SPACEJOBS_DB_ROLE_PASSWORD", "")
    reload_settings()
    assert role_password(WORKER_ROLE) is None
    assert role_url(WORKER_ROLE, "postgresql://a:b@h/d") == "postgresql+psycopg://space_worker@h/d"
