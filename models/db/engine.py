"""Engines and URLs: a small pool per process, psycopg 3 as the only driver."""

from __future__ import annotations

import logging
import re
import select
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError

from spacejobs.models import tracing
from spacejobs.models.settings import get_settings

log = logging.getLogger("spacejobs.db")

#: the execution option that carries an engine's statement timeout behind a transaction-mode
#: pooler, where ``models.db.transaction`` sets it in each transaction (see make_engine)
LOCAL_STATEMENT_TIMEOUT = "spacejobs_local_statement_timeout_ms"
#: seconds to wait for a new connection before trying again (libpq's connect_timeout)
CONNECT_TIMEOUT = 5


class AfterCommitConnection(psycopg.Connection):
    """A psycopg connection that runs callbacks once its transaction has COMMITTED, and drops
    them when it rolls back: what "send the wake-up after commit, never after a rollback" needs
    when the transaction belongs to the caller. SQLAlchemy commits through ``commit()`` here,
    and hands the connection back to its pool through ``rollback()``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.after_commit: list[Callable[[], object]] = []

    def commit(self) -> None:
        super().commit()
        callbacks, self.after_commit = self.after_commit, []
        run_after_commit(callbacks)

    def rollback(self) -> None:
        self.after_commit = []
        super().rollback()


def run_after_commit(callbacks: list[Callable[[], object]]) -> None:
    """Run what waited for a commit that has happened, each on its own."""
    for callback in callbacks:
        try:
            callback()
        except Exception:
            # The transaction is committed; a failed follow-up (a wake-up the broker did not
            # take) is covered by the sweeper and must not look like a failed commit.
            log.exception("an after-commit callback failed")


def connection_options() -> dict[str, int]:
    """What every connection to PostgreSQL is opened with, pooled or not (LISTEN): a bounded
    connect, and TCP settings that make a dead link an error within ``SPACEJOBS_DB_TCP_TIMEOUT``
    seconds. Without them a statement sent into a network cut waits for the kernel: the
    retransmissions back off to two minutes apart, so the process stays stuck well after the
    cut heals, and gives up only after ~15 minutes. ``tcp_user_timeout`` bounds unacknowledged
    data (a statement in flight); keepalives find an idle connection (a LISTEN) cut off."""
    options = {"connect_timeout": CONNECT_TIMEOUT}
    timeout = get_settings().db_tcp_timeout
    if timeout:
        probe = max(1, round(timeout / 3))
        options.update(keepalives=1, keepalives_idle=probe, keepalives_interval=probe,
                       keepalives_count=3, tcp_user_timeout=max(1, round(timeout * 1000)))
    return options


def with_connection_options(conninfo: str) -> str:
    """A libpq conninfo (URL or key=value) for a connection opened outside a pool (a LISTEN),
    with :func:`connection_options` added."""
    return make_conninfo(conninfo, **connection_options())


def driver_url(url: str) -> str:
    """psycopg 3 is the only driver we ship; accept the plain scheme operators write."""
    return re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql+psycopg://", url)


def libpq_url(url: str) -> str:
    """The same URL in the plain form psycopg.connect() and psql take (no driver suffix)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def with_database(url: str, database: str) -> str:
    """The same server and role, another database."""
    return make_url(url).set(database=database).render_as_string(hide_password=False)


def make_engine(
    url: str,
    *,
    pool_size: int = 5,
    max_overflow: int | None = None,
    application_name: str = "spacejobs",
    statement_timeout_ms: int | None = None,
) -> Engine:
    """An engine with a small pool that rides out a database restart.

    The pool keeps ``pool_size`` connections and opens up to ``max_overflow`` more (by default
    as many again) when more are checked out at once; those extra ones are closed as they come
    back, so a process that regularly needs more than ``pool_size`` forks new backends all the
    time: size ``pool_size`` for the threads that use the engine together.

    ``statement_timeout_ms`` bounds every statement, so a web request never hangs on a locked
    or overloaded database: it answers 503 instead. ``hide_parameters``: a statement that fails
    is logged (operators' tracebacks) without its parameters, which may hold tenant data.

    Behind a transaction-mode pooler (``SPACEJOBS_DB_POOLER=transaction``) each transaction of
    a client may run on another server connection, shared with other clients. So: no prepared
    statements (psycopg prepares a statement on its fifth run, on one server connection; the
    next run finds it missing, or its name taken by another client's), and the statement
    timeout is set inside each transaction, because PgBouncer refuses the startup ``options``
    and a session-level SET would stay behind for whoever gets the server connection next.
    """
    pooled = get_settings().db_pooler == "transaction"
    connect_args: dict[str, object] = {"application_name": application_name, **connection_options()}
    execution_options: dict[str, object] = {}
    if pooled:
        connect_args["prepare_threshold"] = None
    if statement_timeout_ms and pooled:
        execution_options[LOCAL_STATEMENT_TIMEOUT] = int(statement_timeout_ms)
    elif statement_timeout_ms:
        connect_args["options"] = f"-c statement_timeout={int(statement_timeout_ms)}"
    engine = create_engine(
        driver_url(url),
        pool_size=pool_size,
        max_overflow=pool_size if max_overflow is None else max_overflow,
        pool_recycle=1800,
        hide_parameters=True,
        connect_args=connect_args,
        execution_options=execution_options,
    )
    event.listen(engine, "checkout", _refuse_dead_connection)
    event.listen(engine, "do_connect", _connect_with_after_commit)
    return engine


def prepare_engine(engine: Engine) -> Engine:
    """Let Space Jobs submit through an application's OWN engine (a Flask-SQLAlchemy
    ``db.engine``), in the application's transactions: its new connections become ones that
    run callbacks after their transaction commits (the wake-up goes out only then), and the
    connections it already pooled are let go. Idempotent. TypeError unless the engine speaks to
    PostgreSQL through psycopg 3 (``postgresql+psycopg://``), the one driver Space Jobs uses."""
    if engine.dialect.name != "postgresql" or engine.dialect.driver != "psycopg":
        raise TypeError("Space Jobs needs an engine of PostgreSQL through psycopg 3 (a URL "
                        f"postgresql+psycopg://…), not {engine.dialect.name}+{engine.dialect.driver}")
    if not event.contains(engine, "do_connect", _connect_with_after_commit):
        event.listen(engine, "do_connect", _connect_with_after_commit)
        engine.dispose()  # the connections it pooled before are closed, never reused
    return engine


def _connect_with_after_commit(_dialect: Any, _record: Any, cargs: tuple[Any, ...],
                               cparams: dict[str, Any]) -> AfterCommitConnection:
    # A span per statement when this process traces (no statement text leaves it).
    return tracing.instrument_connection(AfterCommitConnection.connect(*cargs, **cparams))


def _refuse_dead_connection(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """Check a pooled connection without a round trip (instead of ``pool_pre_ping``'s query on
    every checkout): an idle connection of ours has nothing to read, so a readable socket means
    the server has spoken on its own, and it only does that to say goodbye (a terminated
    backend, a restart, a shutdown). The pool then opens a fresh connection and retries."""
    if dbapi_connection.closed:
        raise DisconnectionError("connection closed")
    readable, _, _ = select.select([dbapi_connection.fileno()], [], [], 0)
    if readable:
        raise DisconnectionError("the server closed this connection")
