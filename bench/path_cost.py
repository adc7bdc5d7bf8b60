"""One job's path, step by step, in one process: what each step costs with nothing else running.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python -m bench.path_cost [--jobs 1000]

The paced latency (``bench.throughput``) is a chain of steps run by different processes on
cores they share with PostgreSQL. This runs the same steps one after another in ONE process,
each job through all of them before the next, with no worker and no other client:

- the submit: ``jobs.enqueue()`` (one ``submit_jobs()`` statement in autocommit, and the wake-up
  guard's ``SET NX`` in Redis);
- the claim a woken pool process makes: a transaction that only claims, as the worker role,
  durable=False (``WorkerLeases.finish_and_claim([], claim=1)``);
- the finish a pool process makes after a job that returned: the finish folded into its next
  claim, which finds nothing (``finish_and_claim([finished], claim=1)``).

For each step it prints the wall time and this process's own CPU time (``time.process_time``)
at p50 and p95: the difference is time spent waiting, for PostgreSQL (and Redis) to answer,
so the two say whether a step's cost is Python's or the server's. The operators' controls are
read once, as a worker's cache does. Nothing is judged: these are the figures the latency's
hops are made of, to compare before and after a change to one step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from bench.harness import percentile
from spacejobs.models.jobs.service import Jobs
from spacejobs.models.kinds import get_kind, load_kinds
from spacejobs.tasks.engine.leases import Finished, WorkerLeases
from spacejobs.tasks.wakeups import WakeupPublisher
from tests.kit.servers import find_or_start
from tests.kit.stack import running_stack

T = TypeVar("T")
WARM_UP = 50
STEPS = ("submit (jobs.enqueue)", "claim-only transaction", "finish folded into a claim")


class Step:
    """Wall and CPU seconds of each run of one step."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def time(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        wall, cpu = time.perf_counter(), time.process_time()
        result = call(*args, **kwargs)
        self.cpu.append(time.process_time() - cpu)
        self.wall.append(time.perf_counter() - wall)
        return result

    def line(self, name: str) -> str:
        wall = [1000 * value for value in self.wall]
        cpu = [1000 * value for value in self.cpu]
        return (f"{name:<28} wall p50 {statistics.median(wall):.3f} / p95 {percentile(wall, 95):.3f}"
                f" ms; this process's CPU p50 {statistics.median(cpu):.3f} / p95"
                f" {percentile(cpu, 95):.3f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.path_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000, help="jobs timed (after a warm-up of "
                                                              f"{WARM_UP})")
    args = parser.parse_args(argv)
    os.environ.setdefault("SPACEJOBS_BENCH_KINDS", "1")
    load_kinds()
    servers = find_or_start()
    try:
        servers.migrated_template()
        with running_stack(servers, Path(tempfile.mkdtemp(prefix="sj-path-"))) as stack:
            org = stack.org()
            user = stack.user(org, role="owner").id
            noop = get_kind("bench.noop").rules
            jobs = Jobs(stack.app_db, wake=WakeupPublisher(stack.redis_url, stack.queue).wake)
            leases = WorkerLeases(stack.worker_db, "path-cost-bench")
            controls = leases.claim_controls()
            steps = {name: Step() for name in STEPS}
            submit, claim, finish = steps.values()
            for index in range(WARM_UP + args.jobs):
                submit.time(jobs.enqueue, "bench.noop", organization_id=org, requested_by=user)
                claimed = claim.time(leases.finish_and_claim, [], claim=1, controls=controls)
                (job,) = claimed.leased
                done = finish.time(leases.finish_and_claim, [Finished(job, noop, {})], claim=1,
                                   controls=controls)
                if [j.id for j in done.completed] != [job.id] or done.leased:
                    raise SystemExit(f"job {index}: not completed alone ({done})")
            for step in steps.values():  # the warm-up's plans and connections are not the path's
                del step.wall[:WARM_UP], step.cpu[:WARM_UP]
            print(f"{args.jobs} jobs, one at a time, one process, no worker:")
            for name, step in steps.items():
                print(step.line(name))
            total = [sum(parts) for parts in zip(*(step.wall for step in steps.values()),
                                                 strict=True)]
            print(f"{'the three together':<28} wall p50 {1000 * statistics.median(total):.3f} ms")
    finally:
        servers.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
