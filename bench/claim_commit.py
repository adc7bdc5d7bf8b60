"""What a claim's commit costs with and without waiting for the WAL flush.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python -m bench.claim_commit [--claims 3000]

Times ``WorkerLeases.finish_and_claim([], claim=1)`` (a transaction that only claims: it
commits with ``synchronous_commit = off``) against the same transaction made durable,
interleaved one by one so that a busy moment of the machine falls on both alike. The
difference is what one WAL flush costs on this server's disk: on fast local storage it is
within noise, on network storage it is most of a claim's time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import models.jobs.leases as leases_module
from bench.harness import percentile
from models.db.transaction import transaction
from models.jobs import store
from models.jobs.leases import WorkerLeases
from models.kinds import get_kind, load_kinds
from tests.kit.servers import find_or_start
from tests.kit.stack import running_stack

ORGANIZATIONS = 4  # each under its quota of active jobs


@contextlib.contextmanager
def forced(durable: bool) -> Iterator[None]:
    """The leases' transactions made ``durable`` (or not) whatever they finish."""
    def opened(engine: Any, **options: Any) -> Any:
        options["durable"] = durable
        return transaction(engine, **options)

    leases_module.transaction = opened  # type: ignore[assignment]
    try:
        yield
    finally:
        leases_module.transaction = transaction


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.claim_commit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--claims", type=int, default=3000, help="claims in all, half each way")
    args = parser.parse_args(argv)
    os.environ.setdefault("SPACEJOBS_BENCH_KINDS", "1")
    load_kinds()
    servers = find_or_start()
    try:
        servers.migrated_template()
        with running_stack(servers, Path(tempfile.mkdtemp(prefix="sj-claim-"))) as stack:
            tenants = [(org, stack.user(org, role="owner").id)
                       for org in (stack.org() for _ in range(ORGANIZATIONS))]
            noop = get_kind("bench.noop").rules
            with transaction(stack.app_db) as conn:
                for index in range(args.claims):
                    org, user = tenants[index % ORGANIZATIONS]
                    store.submit(conn, organization_id=org, requested_by=user, kind=noop, params={})
            leases = WorkerLeases(stack.worker_db, "claim-commit-bench")
            seconds: dict[bool, list[float]] = {True: [], False: []}
            for index in range(args.claims):
                durable = index % 2 == 0
                with forced(durable):
                    began = time.perf_counter()
                    leases.finish_and_claim([], claim=1)
                    seconds[durable].append(time.perf_counter() - began)
            for durable, values in seconds.items():
                ms = [1000 * value for value in values]
                print(f"claim-only transaction, {'durable' if durable else 'no flush wait':<13}:"
                      f" p50 {statistics.median(ms):.3f} ms, p95 {percentile(ms, 95):.3f} ms"
                      f" ({len(ms)} claims)")
    finally:
        servers.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
