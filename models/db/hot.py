"""The hot path's statements, run on the DBAPI cursor beneath SQLAlchemy.

For each statement SQLAlchemy builds a result: it reads the cursor's description, matches the
columns by name (a textual statement's, every time: nothing tells it they do not change), and
wraps each row. For the few statements every job or request runs (its submit, each
transaction's scope, an API request's token check, the claim, the finish's standing check and
fenced update) that costs more than the rest of the client's work on them: one
9-column row took 299 µs through ``Connection.execute(text(...))`` and 132 µs through the
cursor, measured on this project's machine (the figures in docs/benchmarks.md, "The latency's
path, step by step").

:func:`rows` keeps what callers rely on from SQLAlchemy: the same connection and transaction
(the pool's connection, its scope and its commit are SQLAlchemy's), the same SQL text (the
``:name`` blocks of the ``.sql`` files, compiled once to psycopg's ``%(name)s``), and the same
errors: a failure is raised as the ``sqlalchemy.exc.DBAPIError`` subclass SQLAlchemy raises,
with its parameters hidden, and a connection the failure shows dead is invalidated, so the
pool replaces it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.rows import dict_row, namedtuple_row
from sqlalchemy import Connection, TextClause
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError


def rows(conn: Connection, query: TextClause, params: Mapping[str, Any], *,
         as_dicts: bool = False) -> list[Any]:
    """Every row ``query`` answers with ``params`` on ``conn``: named tuples (``row.id``), or
    dicts with ``as_dicts``."""
    statement = _compiled(query, conn.dialect)
    dbapi = conn.connection.dbapi_connection
    assert isinstance(dbapi, psycopg.Connection)
    cursor = dbapi.cursor(row_factory=dict_row if as_dicts else namedtuple_row)
    try:
        cursor.execute(statement, params)
        return cursor.fetchall()
    except psycopg.Error as error:
        dead = conn.dialect.is_disconnect(error, dbapi, cursor)
        if dead:
            conn.invalidate(error)
        raise DBAPIError.instance(statement, None, error, psycopg.Error, hide_parameters=True,
                                  connection_invalidated=dead, dialect=conn.dialect) from error
    finally:
        cursor.close()


@functools.cache
def _compiled(query: TextClause, dialect: Dialect) -> str:
    return str(query.compile(dialect=dialect))
