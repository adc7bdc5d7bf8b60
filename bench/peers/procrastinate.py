"""Procrastinate with its psycopg connector on its defaults, with one no-op task.

The schema comes from Procrastinate's schema manager. Workers are its CLI, ``procrastinate
worker``, with every worker option at its default: concurrency 1, LISTEN/NOTIFY on, 5 s
polling, finished jobs kept, log level INFO. The task is ``async def`` and deferred with
``defer_async`` (``batch_defer_async`` for bulk), as in Procrastinate's own benchmark
(tests/benchmarks/test_benchmark_async.py).

Figures come from ``procrastinate_events``: Procrastinate's triggers write a ``deferred`` row
when a job is inserted, ``started`` when a worker fetches it and ``succeeded`` when it is
finished, each stamped with its statement's ``now()``.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from importlib.metadata import version
from typing import ClassVar

import procrastinate

from bench.peers.base import PostgresPeer, statements_beside

DSN_ENV = "BENCH_PEER_PROCRASTINATE_DSN"

# The worker CLI loads this app (``--app bench.peers.procrastinate.app``) and connects it from
# the environment; the benchmark swaps in a connector of its own with ``replace_connector``.
app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ.get(DSN_ENV, "")))


@app.task(name="noop")
async def noop() -> None:
    """Nothing: the job's row and its events are the record."""


class ProcrastinatePeer(PostgresPeer):
    name = "procrastinate"
    title = f"Procrastinate {version('procrastinate')}"
    defaults: ClassVar[str] = (
        "P x `procrastinate --app … worker` (defaults: concurrency 1, listen_notify on, 5 s polling,"
        " delete_jobs never, log level INFO), PsycopgConnector with psycopg_pool's defaults, async"
        " no-op task; producer: defer_async over the same connector")
    statements = statements_beside(__file__)
    enqueue_api = "await noop.defer_async()"
    bulk_api = "await noop.batch_defer_async(...)"
    records = "`started` / `succeeded` procrastinate_events rows"

    def __init__(self) -> None:
        super().__init__()
        self.stack = ExitStack()

    async def _open(self) -> None:
        self.stack.enter_context(app.replace_connector(procrastinate.PsycopgConnector(conninfo=self.db.url)))
        await app.open_async()
        await app.schema_manager.apply_schema_async()

    async def _close(self) -> None:
        try:
            await app.close_async()
        finally:
            self.stack.close()

    async def _clear(self) -> None:
        await app.connector.execute_query_async(self.statements["clear"])

    async def _submit_one(self) -> None:
        await noop.defer_async()

    async def _submit_many(self, count: int) -> None:
        await noop.batch_defer_async(*({} for _ in range(count)))

    def _worker_argv(self) -> tuple[list[str], dict[str, str]]:
        return (["-m", "procrastinate", "--app", "bench.peers.procrastinate.app", "worker"],
                {DSN_ENV: self.db.url})
