"""What the database lets each role do with passwords and web sessions, tried as that role."""

from __future__ import annotations

import hashlib

import pytest
from argon2 import PasswordHasher
from sqlalchemy import text
from sqlalchemy.exc import ProgrammingError

from spacejobs.models.db.engine import make_engine
from spacejobs.models.db.transaction import transaction
from spacejobs.models.tenancy import passwords, sessions
from tests.kit.stack import Stack

PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def people(bare_stack: Stack):
    org = bare_stack.org()
    users = [bare_stack.user(org, role="member", password=PASSWORD) for _ in range(2)]
    urls = {"app": bare_stack.app_url, "worker": bare_stack.worker_url,
            "operator": bare_stack.operator_url}
    engines = {name: make_engine(url, pool_size=1) for name, url in urls.items()}
    yield users, engines
    for engine in engines.values():
        engine.dispose()


def stored_hash(stack: Stack, user_id) -> str:
    with stack.admin() as conn:
        return conn.execute(text("SELECT password_hash FROM user_passwords WHERE user_id = :u"),
                            {"u": user_id}).scalar_one()


@pytest.mark.parametrize("role", ["app", "worker", "operator"])
def test_no_application_role_can_read_a_password_hash(people, role):
    _users, engines = people
    for statement in ("SELECT password_hash FROM user_passwords", "SELECT count(*) FROM user_passwords"):
        with pytest.raises(ProgrammingError, match="permission denied"), transaction(engines[role]) as conn:
            conn.execute(text(statement))


def test_the_web_role_gets_a_challenge_without_the_digest_and_only_a_yes_or_no(bare_stack: Stack, people):
    users, engines = people
    with transaction(engines["app"]) as conn:
        # Even looping over every email it may read, the web role gets no digest.
        challenges = conn.execute(text("SELECT login_challenge(email) FROM users")).scalars().all()
        assert passwords.check_login(conn, users[0].email, PASSWORD) == users[0].id
        assert passwords.check_login(conn, users[0].email.upper(), PASSWORD) == users[0].id
        assert passwords.check_login(conn, users[0].email, PASSWORD + "!") is None
        assert passwords.check_login(conn, users[1].email, "") is None
    for user in users:
        stored = stored_hash(bare_stack, user.id)
        digest = stored.rsplit("$", 1)[1]
        assert stored.rsplit("$", 1)[0] in challenges
        assert not any(digest in (c or "") for c in challenges)
        PasswordHasher().verify(stored, PASSWORD)  # a standard argon2id PHC string


@pytest.mark.parametrize("role", ["worker", "operator"])
def test_only_the_web_role_may_ask_about_logins_or_touch_sessions(people, role):
    _users, engines = people
    for statement in ("SELECT login_challenge('x@example.test')", "SELECT check_login('x', 'y')",
                      "SELECT count(*) FROM web_sessions"):
        with pytest.raises(ProgrammingError, match="permission denied"), transaction(engines[role]) as conn:
            conn.execute(text(statement))


def test_the_web_role_may_only_mark_a_session_seen_or_revoked(people):
    users, engines = people
    with transaction(engines["app"]) as conn:
        session_id = sessions.start(conn, users[0].id, max_age_seconds=60)
    digest = hashlib.sha256(session_id.encode()).digest()
    for change in ("user_id = :other", "expires_at = now() + interval '10 years'",
                   "auth_method = 'password'", "created_at = now()"):
        with pytest.raises(ProgrammingError, match="permission denied"), transaction(engines["app"]) as conn:
            conn.execute(text(f"UPDATE web_sessions SET {change} WHERE id_hash = :h"),
                         {"h": digest, "other": users[1].id})
    with transaction(engines["app"]) as conn:
        found = sessions.resume(conn, session_id, idle_seconds=60)
        assert found is not None and found.user.id == users[0].id
        sessions.revoke(conn, session_id)
        assert sessions.resume(conn, session_id, idle_seconds=60) is None
        # The cookie's id itself is never stored: the table holds its hash only.
        assert conn.execute(text("SELECT count(*) FROM web_sessions WHERE id_hash = :raw"),
                            {"raw": session_id.encode()}).scalar_one() == 0
