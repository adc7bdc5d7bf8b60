"""Transactions scoped to a tenant, a user and an actor.

Every transaction that touches tenant data says, inside the transaction, which organization (and
which user) it acts for, with ``set_config(..., true)``: the setting ends with the transaction,
so a pooled connection never carries one tenant's scope into the next request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar
from uuid import UUID

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from spacejobs.models.db import hot
from spacejobs.models.db.engine import LOCAL_STATEMENT_TIMEOUT, AfterCommitConnection, run_after_commit
from spacejobs.models.db.queries import queries_beside
from spacejobs.models.db.roles import OWNER_ROLE

Q = queries_beside(__file__)

T = TypeVar("T")


@contextmanager
def statement_alone(engine: Engine) -> Iterator[Connection]:
    """A connection on which each statement is a transaction of its own (autocommit): the
    server runs it from its start to its commit whatever becomes of this process meanwhile. For
    a statement that takes a lock others wait for, which a process paused between BEGIN and
    COMMIT (a stopped beat, a long garbage collection) must never hold on to."""
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        yield conn


@contextmanager
def transaction(
    engine: Engine,
    *,
    organization_id: UUID | str | None = None,
    user_id: UUID | str | None = None,
    actor: str | None = None,
    durable: bool = True,
    lease: tuple[UUID, UUID] | None = None,
) -> Iterator[Connection]:
    """One transaction, scoped to a tenant and a user when given; commits unless it raises.

    ``durable=False`` lets its COMMIT return before the WAL reaches the disk
    (``synchronous_commit = off`` for this transaction only): a crash may then undo it although
    the commit succeeded. Only for work whose loss the design already covers.

    ``lease`` (a job's id and lease token): the worker's tenant transaction of a job it holds.
    The worker role's row-level security admits the tenant data of that job's organization
    while the token holds the lease, and nothing else (lease_org() in the schema).
    """
    def first(conn: Connection) -> None:
        scope(conn, organization_id=organization_id, user_id=user_id, actor=actor,
              durable=durable, lease=lease)

    with opened(engine, first) as (conn, _):
        yield conn


@contextmanager
def opened(engine: Engine, first: Callable[[Connection], T]) -> Iterator[tuple[Connection, T]]:
    """A transaction whose first statement is ``first(conn)`` (for a request, the one that
    authenticates and scopes it; behind a pooler, the statement timeout goes first); yields
    the connection and what ``first`` returned, and commits unless the block raises.

    That first statement is tried on a second connection when the first one turns out to be
    dead: a pooled connection whose backend was just terminated or restarted may not have said
    so yet when the pool's checkout looked at it. Nothing has run at that point, so trying again
    is safe; any later failure is the caller's to see.
    """
    for attempt in (1, 2):
        conn = engine.connect()
        try:
            trans = conn.begin()
            _bound_statements(conn)
            result = first(conn)
            break
        except DBAPIError as error:
            conn.close()
            if attempt == 2 or not error.connection_invalidated:
                raise
    with conn, trans:
        yield conn, result


def _bound_statements(conn: Connection) -> None:
    """Behind a transaction-mode pooler the engine's statement timeout is this transaction's
    own (models.db.engine.make_engine says why): one more round trip, web only."""
    timeout_ms = conn.get_execution_options().get(LOCAL_STATEMENT_TIMEOUT)
    if timeout_ms:
        conn.execute(Q["statement_timeout"], {"ms": str(timeout_ms)})


def scope(
    conn: Connection,
    *,
    organization_id: UUID | str | None = None,
    user_id: UUID | str | None = None,
    actor: str | None = None,
    durable: bool = True,
    lease: tuple[UUID, UUID] | None = None,
) -> None:
    """Set the transaction-local tenant, user and actor (``SET LOCAL`` cannot bind parameters),
    the job's lease a worker presents (see :func:`transaction`), and
    ``synchronous_commit = off`` when the transaction need not be ``durable``."""
    # Every transaction's first statement: on the driver's cursor (models/db/hot.py says why).
    hot.rows(conn, Q["scope"], {
        "org": str(organization_id) if organization_id else "",
        "user": str(user_id) if user_id else "",
        "actor": actor or "",
        "durable": durable,
        "lease": lease is not None,
        "job": str(lease[0]) if lease else "",
        "token": str(lease[1]) if lease else "",
    })


@contextmanager
def owner_transaction(engine: Engine, *, actor: str = "cli") -> Iterator[Connection]:
    """A transaction as the owner role, from an admin connection (``DATABASE_URL``): the CLI's
    administrative path. Web and workers never use it."""
    with engine.begin() as conn:
        conn.execute(Q[f"set_role_{OWNER_ROLE}"])
        scope(conn, actor=actor)
        yield conn


def after_commit(conn: Connection, callback: Callable[[], object]) -> None:
    """Run ``callback`` once the transaction open on ``conn`` has committed; never if it rolls
    back. ``conn`` must come from an engine made by :func:`models.db.engine.make_engine`."""
    dbapi = conn.connection.dbapi_connection
    if not isinstance(dbapi, AfterCommitConnection):
        raise TypeError("a submit needs a connection of an engine Space Jobs made or prepared "
                        "(spacejobs.models.db.engine.prepare_engine(), which SpaceJobs(app, "
                        "db=db) does for Flask-SQLAlchemy's engine) before its first connection")
    if dbapi.autocommit:
        run_after_commit([callback])  # each statement commits by itself: this one has
    else:
        dbapi.after_commit.append(callback)
