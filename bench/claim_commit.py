"""What a claim's commit costs with and without waiting for the WAL flush.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python -m bench.claim_commit [--claims 3000]

Times a transaction that only claims (one job, as the worker role, the claim statement
``WorkerLeases.finish_and_claim([], claim=1)`` runs) committed as the workers commit it
(``durable=False``: ``synchronous_commit = off``) against the same transaction made durable,
interleaved one by one so that a busy moment of the machine falls on both alike. The
difference is what one WAL flush costs on this server's disk: on fast local storage it is
within noise, on network storage it is most of a claim's time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.harness import percentile
from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.kinds import get_kind, load_kinds
from tests.kit.servers import find_or_start
from tests.kit.stack import running_stack

ORGANIZATIONS = 4  # each under its quota of active jobs


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
                    store.submit(conn, [store.NewJob(noop, {})],
                                 organization_id=org, requested_by=user)
            seconds: dict[bool, list[float]] = {True: [], False: []}
            for index in range(args.claims):
                durable = index % 2 == 0
                began = time.perf_counter()
                with transaction(stack.worker_db, actor="worker:claim-commit-bench",
                                 durable=durable) as conn:
                    store.claim_batch(conn, "claim-commit-bench", limit=1, controls=[])
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
