"""The hot path's statements on the driver's cursor (models/db/hot.py) behave as SQLAlchemy's
own executes do for everyone above them: rows by name, errors of SQLAlchemy's classes with the
parameters withheld, a dead connection replaced, and the same transaction as the statements
around them. Run as the worker role, as the claim and the finish run."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DataError, DBAPIError

from spacejobs.models.db import hot
from spacejobs.models.db.engine import make_engine
from spacejobs.models.db.transaction import transaction
from tests.kit.stack import Stack

SECRET = "tenant-text-7f3a"


@pytest.fixture()
def worker_db(stack: Stack):
    engine = make_engine(stack.worker_url, pool_size=1)
    yield engine
    engine.dispose()


def test_rows_read_by_name_as_tuples_or_dicts_in_the_callers_transaction(worker_db):
    query = text("SELECT CAST(:n AS integer) AS n, current_setting('app.actor') AS actor")
    with transaction(worker_db, actor="worker:hot-test") as conn:
        (row,) = hot.rows(conn, query, {"n": 7})
        (as_dict,) = hot.rows(conn, query, {"n": 8}, as_dicts=True)
    # the scope set by the transaction's first statement is seen: same connection, same transaction
    assert (row.n, row.actor) == (7, "worker:hot-test")
    assert as_dict == {"n": 8, "actor": "worker:hot-test"}


def test_a_failed_statement_raises_sqlalchemys_error_without_its_parameters(worker_db):
    query = text("SELECT 1 / CAST(:zero AS integer) WHERE CAST(:secret AS text) IS NOT NULL")
    with pytest.raises(DataError) as raised, transaction(worker_db, actor="worker:hot-test") as conn:
        hot.rows(conn, query, {"zero": 0, "secret": SECRET})
    assert "division by zero" in str(raised.value)
    assert SECRET not in str(raised.value) and SECRET not in repr(raised.value)
    assert raised.value.connection_invalidated is False
    # the failed transaction was rolled back and the connection serves the next one
    with transaction(worker_db, actor="worker:hot-test") as conn:
        assert hot.rows(conn, text("SELECT 1 AS one"), {})[0].one == 1


def test_a_connection_that_died_is_invalidated_and_replaced(stack: Stack, worker_db):
    with pytest.raises(DBAPIError) as raised, transaction(worker_db, actor="worker:hot-test") as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with stack.admin_db.begin() as admin:  # the server's administrator, as an operator
            admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        hot.rows(conn, text("SELECT 1 AS one"), {})
    assert raised.value.connection_invalidated is True
    with transaction(worker_db, actor="worker:hot-test") as conn:
        assert hot.rows(conn, text("SELECT pg_backend_pid() AS pid"), {})[0].pid != pid
