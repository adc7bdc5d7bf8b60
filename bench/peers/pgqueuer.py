"""PgQueuer (asyncpg) on its defaults, with one no-op entrypoint.

The schema comes from PgQueuer's own installer (``Queries.install()``, default durability
``durable``: every table logged). Workers run what ``pgq run`` runs, ``pgqueuer.run(factory)``
on uvloop with the supervisor's defaults (continuous mode, batch 10, no concurrency limit, 30 s
dequeue and heartbeat timeouts), started as ``python -m bench.peers.pgqueuer``: ``pgq run``
itself fails in PgQueuer 1.6.0 with the typer this environment resolves (its ``--log-level``
reaches ``setup_fancy_logger`` as a string), so this module sets up the same INFO logging and
calls the same function.

Figures come from ``pgqueuer_log``: PgQueuer writes a ``queued`` row in the enqueue statement,
a ``picked`` row in the dequeue statement and a ``successful`` row when a worker flushes its
status buffer (every 10 jobs, or ~0.1 s after the first one), each stamped with its statement's
``now()``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from importlib.metadata import version
from typing import ClassVar

import asyncpg
import pgqueuer
import uvloop
from pgqueuer import AsyncpgDriver, Job, PgQueuer, Queries
from pgqueuer.core import logconfig

from bench.peers.base import PostgresPeer, statements_beside

ENTRYPOINT = "noop"
DSN_ENV = "BENCH_PEER_PGQUEUER_DSN"
# Only so the benchmark can tell the workers' connections apart; not a PgQueuer setting.
WORKER_APPLICATION = "bench-peer-pgqueuer-worker"


@asynccontextmanager
async def create_pgqueuer() -> AsyncIterator[PgQueuer]:
    """The worker's factory, shaped like the one in PgQueuer's quickstart."""
    connection = await asyncpg.connect(os.environ[DSN_ENV],
                                       server_settings={"application_name": WORKER_APPLICATION})
    pgq = PgQueuer.from_asyncpg_connection(connection)

    @pgq.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        """Nothing: the log rows PgQueuer writes for the job are the record."""

    try:
        yield pgq
    finally:
        await connection.close()


@contextmanager
def open_queries(url: str) -> Iterator[tuple[asyncio.Runner, asyncpg.Connection, Queries]]:
    """PgQueuer's ``Queries`` over an asyncpg connection of its own, on a uvloop runner of the
    calling thread: for a producer or a probe in a thread beside the driver's own (bench.hold)."""
    runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    try:
        connection = runner.run(asyncpg.connect(url))
        try:
            yield runner, connection, Queries(AsyncpgDriver(connection))
        finally:
            runner.run(connection.close())
    finally:
        runner.close()


def run_worker() -> None:
    logconfig.setup_fancy_logger(logconfig.LogLevel.INFO)  # `pgq run`'s default level
    uvloop.run(pgqueuer.run(create_pgqueuer))


class PgQueuerPeer(PostgresPeer):
    name = "pgqueuer"
    title = f"PgQueuer {version('pgqueuer')}"
    defaults: ClassVar[str] = (
        "P x `pgqueuer.run(factory)` (what `pgq run` runs: uvloop, continuous mode, batch_size 10,"
        " no concurrency limit, 30 s dequeue/heartbeat timeouts, status buffer of 10 / ~0.1 s), one"
        " asyncpg connection per process, async no-op entrypoint, durability `durable`; producer:"
        " Queries.enqueue over one asyncpg connection on uvloop")
    statements = statements_beside(__file__)
    enqueue_api = f"await Queries.enqueue('{ENTRYPOINT}', None)"
    bulk_api = "await Queries.enqueue(lists)"
    records = "`picked` / `successful` pgqueuer_log rows"
    loop_factory = staticmethod(uvloop.new_event_loop)

    connection: asyncpg.Connection | None = None

    async def _open(self) -> None:
        self.connection = await asyncpg.connect(self.db.url)
        self.queries = Queries(AsyncpgDriver(self.connection))
        await self.queries.install()

    async def _close(self) -> None:
        if self.connection is not None:
            await self.connection.close()

    async def _clear(self) -> None:
        await self.queries.clear_queue()
        await self.queries.clear_queue_log()
        await self.queries.clear_statistics_log()

    async def _submit_one(self) -> None:
        await self.queries.enqueue(ENTRYPOINT, None)

    async def _submit_many(self, count: int) -> None:
        await self.queries.enqueue([ENTRYPOINT] * count, [None] * count, [0] * count)

    def _worker_argv(self) -> tuple[list[str], dict[str, str]]:
        return ["-m", "bench.peers.pgqueuer"], {DSN_ENV: self.db.url}


if __name__ == "__main__":
    run_worker()
