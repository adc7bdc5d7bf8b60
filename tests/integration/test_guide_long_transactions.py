"""The operations guide's watch on long transactions (docs/guides/operations.md, "Long
transactions"), run as the guide gives it: with a reporting transaction held open on the queue's
database, its query names that session first, idle in a transaction that holds a snapshot; and
the timeout the guide sets for such a session ends it."""

from __future__ import annotations

import re
import time

import psycopg
import pytest

from spacejobs.models.db.engine import libpq_url
from tests.kit.processes import REPO_ROOT
from tests.kit.stack import Stack

GUIDE = REPO_ROOT / "docs" / "guides" / "operations.md"


def guide_block(starting: str) -> str:
    """The guide's ```sql block whose text starts with ``starting``."""
    blocks = re.findall(r"```sql\n(.*?)```", GUIDE.read_text(), re.DOTALL)
    found = [block for block in blocks if block.startswith(starting)]
    assert len(found) == 1, f"the guide has {len(found)} sql blocks starting {starting!r}"
    return found[0]


@pytest.fixture
def held_report(bare_stack: Stack):
    """A REPEATABLE READ transaction as the operator role, idle after one read."""
    with psycopg.connect(libpq_url(bare_stack.operator_url), application_name="bi-report") as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with conn.transaction():
            conn.execute("SELECT count(*) FROM jobs").fetchone()
            yield conn.info.backend_pid


def test_the_guides_query_names_the_session_that_holds_the_oldest_snapshot(
        bare_stack: Stack, held_report: int) -> None:
    query = guide_block("SELECT pid, usename")
    with psycopg.connect(libpq_url(bare_stack.admin_url)) as admin:
        time.sleep(0.2)  # its state is "idle in transaction" once it has answered
        rows = admin.execute(query).fetchall()
    assert rows, "no session holds a snapshot"
    pid, user, application, state, open_for, _age = rows[0]
    assert (pid, user, application, state) == (held_report, "space_operator", "bi-report",
                                               "idle in transaction")
    assert open_for.total_seconds() > 0


def test_an_idle_transaction_past_the_guides_kind_of_bound_is_ended(bare_stack: Stack) -> None:
    # The guide's bound is a minute; the same setting, shortened, on one session.
    with psycopg.connect(libpq_url(bare_stack.operator_url),
                         options="-c idle_in_transaction_session_timeout=300") as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.execute("SELECT count(*) FROM jobs").fetchone()
        time.sleep(1.0)
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            conn.execute("SELECT 1").fetchone()
    assert "idle_in_transaction_session_timeout" in guide_block("-- Space Jobs' own roles")
