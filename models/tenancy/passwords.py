"""Passwords: argon2id hashes (argon2-cffi) that the web role never reads.

The owner role (the CLI) stores a standard PHC string made by argon2-cffi's
:class:`~argon2.PasswordHasher`. To sign someone in, the web asks the database for that string
WITHOUT its digest (:func:`login_challenge`: algorithm, costs, salt), hashes the password it was
given with the same parameters, and lets the database compare the whole string
(``check_login``). The web therefore never holds a stored digest, and the database role it
connects as cannot read one (see 0004_people.sql).
"""

from __future__ import annotations

import base64
import functools
import re
from uuid import UUID

from argon2 import PasswordHasher, Type
from argon2.low_level import hash_secret_raw
from sqlalchemy import Connection

from spacejobs.models.db.queries import queries_beside
from spacejobs.models.errors import InvalidRequest
from spacejobs.models.settings import get_settings
from spacejobs.models.tenancy import sessions

Q = queries_beside(__file__)

HASH_LEN = 32  # bytes of digest; the challenge does not carry it, so it is fixed here
MIN_LENGTH = 10
MAX_LENGTH = 1024  # argon2 takes any length; a bound keeps one sign-in from costing much more
_CHALLENGE = re.compile(r"^\$argon2id\$v=(\d+)\$m=(\d+),t=(\d+),p=(\d+)\$([A-Za-z0-9+/]+)$")


@functools.cache
def _hasher(memory_kib: int, time_cost: int, parallelism: int) -> PasswordHasher:
    return PasswordHasher(memory_cost=memory_kib, time_cost=time_cost, parallelism=parallelism,
                          hash_len=HASH_LEN, type=Type.ID)


def _configured() -> PasswordHasher:
    settings = get_settings()
    return _hasher(settings.password_memory_kib, settings.password_time_cost,
                   settings.password_parallelism)


def _dummy_challenge() -> str:
    """Hashed against when the email is unknown, so an unknown address costs the time of a
    known one with a wrong password (the configured costs; any salt will do)."""
    hasher = _configured()
    return (f"$argon2id$v=19$m={hasher.memory_cost},t={hasher.time_cost},"
            f"p={hasher.parallelism}$c3BhY2Vqb2JzLWR1bW15")


def hash_password(password: str) -> str:
    """A new argon2id hash (random salt, the configured costs) in PHC form."""
    check_acceptable(password)
    return _configured().hash(password)


def check_acceptable(password: str) -> None:
    if not MIN_LENGTH <= len(password) <= MAX_LENGTH:
        raise InvalidRequest(f"A password needs {MIN_LENGTH} to {MAX_LENGTH} characters.")


def answer_challenge(challenge: str, password: str) -> str | None:
    """The PHC string that ``password`` would have under ``challenge``'s parameters and salt."""
    found = _CHALLENGE.match(challenge)
    if found is None:
        return None
    version, memory, time_cost, parallelism, salt = found.groups()
    digest = hash_secret_raw(
        password.encode(), base64.b64decode(salt + "=" * (-len(salt) % 4)),
        time_cost=int(time_cost), memory_cost=int(memory), parallelism=int(parallelism),
        hash_len=HASH_LEN, type=Type.ID, version=int(version),
    )
    return challenge + "$" + base64.b64encode(digest).decode().rstrip("=")


def set_password(conn: Connection, user_id: UUID, password: str) -> int:
    """Owner role (the CLI). A new password signs the user out everywhere, as a reset after a
    leak must; returns how many live web sessions that ended."""
    conn.execute(Q["set_password"], {"user": user_id, "hash": hash_password(password)})
    return sessions.revoke_all(conn, user_id)


def check_login(conn: Connection, email: str, password: str) -> UUID | None:
    """Web role: the user id when the email and password match, else None (same cost either way)."""
    email = email.strip().lower()
    if not email or len(email) > 320 or len(password) > MAX_LENGTH:
        return None
    challenge = conn.execute(Q["login_challenge"], {"email": email}).scalar_one_or_none()
    candidate = answer_challenge(challenge or _dummy_challenge(), password)
    if challenge is None or candidate is None:
        return None
    return conn.execute(Q["check_login"], {"email": email, "candidate": candidate}).scalar_one_or_none()
