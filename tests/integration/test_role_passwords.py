"""Each login role can have its own password, so each deployed service holds only its own secret
(compose.yaml gives the web `space_app`'s and `space_operator`'s, the workers `space_worker`'s)."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from sqlalchemy import text

from spacejobs.models.db.engine import make_engine
from spacejobs.models.db.migrate import ensure_roles
from spacejobs.models.settings import reload_settings
from tests.kit.servers import Servers

PASSWORDS = {"space_app": "app-7c1e", "space_worker": "worker-93ad", "space_operator": "ops-5b20"}


def _scram_matches(verifier: str, password: str) -> bool:
    """Whether a PostgreSQL SCRAM-SHA-256 verifier (pg_authid.rolpassword) is this password's."""
    _method, salt_part, key_part = verifier.split("$")
    iterations, salt = salt_part.split(":")
    stored_key = key_part.split(":")[0]
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt), int(iterations))
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    return hashlib.sha256(client_key).digest() == base64.b64decode(stored_key)


def test_db_upgrade_sets_each_login_role_its_own_password(servers: Servers, monkeypatch) -> None:
    monkeypatch.setenv("SPACEJOBS_DB_ROLE_PASSWORD", "shared-never-used")
    for role, password in PASSWORDS.items():
        monkeypatch.setenv(f"SPACEJOBS_{role.removeprefix('space_').upper()}_DB_PASSWORD", password)
    reload_settings()
    engine = make_engine(servers.admin_url, pool_size=1)
    try:
        with engine.connect() as conn:
            transaction = conn.begin()
            try:
                ensure_roles(conn)
                verifiers = dict(conn.execute(text(
                    "SELECT rolname, rolpassword FROM pg_authid WHERE rolname = ANY(:roles)"),
                    {"roles": list(PASSWORDS)}).all())
            finally:
                # Roles are cluster-wide, shared with every other test session: leave them be.
                transaction.rollback()
    finally:
        engine.dispose()
        monkeypatch.undo()
        reload_settings()

    if not all(v and v.startswith("SCRAM-SHA-256$") for v in verifiers.values()):
        pytest.skip("the server does not store SCRAM-SHA-256 verifiers")
    for role, verifier in verifiers.items():
        assert [other for other, pw in PASSWORDS.items() if _scram_matches(verifier, pw)] == [role]
        assert not _scram_matches(verifier, "shared-never-used")
