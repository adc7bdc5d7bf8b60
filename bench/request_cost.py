"""What one request costs the web's Python: CPU per request in one process, with no server and
no other thread, and the functions a submit spends it in.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python -m bench.request_cost [--requests 1000] [--top 25]
    .venv/bin/python -m bench.request_cost --embedded ...   # on servers started for the run

The web app (``create_app``, its rate limits counted in Redis but lifted so none refuses, the
benchmark's organization without a quota of active jobs) answers through Flask's test client
in this process, one request after another, for:

- a URL that does not exist: Flask's 404, no database, no Redis;
- ``GET /api/v1/me``: the token checked and the user's memberships read;
- ``POST /api/v1/orgs/{org}/jobs`` of ``bench.noop``: a submit, its rate limits and wake-up guard;
- ``GET /api/v1/orgs/{org}/jobs?limit=100``: a page of 100 jobs (those the submits made).

For each it prints this process's CPU time per request (``time.process_time``) beside the wall
time, whose difference is the time spent waiting for PostgreSQL and Redis, and the Python
function calls per request. Then the submit again under ``cProfile``: the functions with the
most time of their own, and the calls of ours (and of the libraries we call) with the most
time inside them. What it leaves out is gunicorn's share (HTTP parsing, the access log, the
hand-off between threads), which ``python -m bench.web_ceiling --profile`` sees under load.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.peers import load_peer
from bench.peers.spacejobs import REQUEST_LIMITS, UNLIMITED
from bench.servers import add_embedded_option, measured_on
from spacejobs.webapp.limits import limiter_storage

WARM_UP = 100


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.request_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000, help="requests per URL")
    parser.add_argument("--top", type=int, default=25, help="functions listed from the profile")
    add_embedded_option(parser)
    args = parser.parse_args(argv)
    with measured_on(args.embedded) as (admin_url, redis_url):
        measure(args, admin_url, redis_url)
    return 0


def measure(args: argparse.Namespace, admin_url: str, redis_url: str) -> None:
    peer = load_peer("spacejobs").prepare(admin_url, redis_url, "cost" + uuid.uuid4().hex[:6])
    try:
        # The benchmark's tenant has no quota of active jobs; the limits are counted in Redis,
        # as in production, but lifted.
        stack, tenant = peer.stack, peer.tenant
        app = stack.make_app(RATELIMIT_STORAGE_URI=limiter_storage(stack.redis_url),
                             **dict.fromkeys(REQUEST_LIMITS, UNLIMITED))
        client = app.test_client()
        headers = {"Authorization": f"Bearer {tenant.member.token}"}
        submit_url = f"/api/v1/orgs/{tenant.organization_id}/jobs"

        def submit() -> int:
            return client.post(submit_url, json={"kind": "bench.noop"}, headers=headers).status_code

        calls: list[tuple[str, Callable[[], int], int]] = [
            ("a URL that does not exist (404)", lambda: client.get("/nothing").status_code, 404),
            ("GET /api/v1/me", lambda: client.get("/api/v1/me", headers=headers).status_code, 200),
            ("POST …/jobs", submit, 202),
            ("GET …/jobs?limit=100", lambda: client.get(submit_url + "?limit=100",
                                                        headers=headers).status_code, 200)]
        print(f"one process, Flask's test client, {args.requests:,} requests per URL after"
              f" {WARM_UP} to warm up; per request:")
        for label, call, expected in calls:
            cpu, wall, functions = timed(call, expected, args.requests)
            print(f"{label:<34} CPU {cpu * 1000:6.3f} ms  wall {wall * 1000:6.3f} ms"
                  f"  {functions:7,.0f} Python function calls", flush=True)
        print()
        print(profile(submit, args.requests, args.top))
    finally:
        peer.cleanup()


def timed(call: Callable[[], int], expected: int, n: int) -> tuple[float, float, float]:
    """CPU and wall seconds per call, and Python function calls per call (counted apart)."""
    for _ in range(WARM_UP):
        answered(call, expected)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(n):
        answered(call, expected)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    counted = cProfile.Profile()
    counted.enable()
    for _ in range(min(n, 200)):
        answered(call, expected)
    counted.disable()
    stats: Any = pstats.Stats(counted)
    return cpu / n, wall / n, stats.total_calls / min(n, 200)


def answered(call: Callable[[], int], expected: int) -> None:
    status = call()
    if status != expected:
        raise SystemExit(f"answered {status}, expected {expected}: the benchmark's set-up is wrong")


def profile(call: Callable[[], int], n: int, top: int) -> str:
    """The submit under cProfile: own time first, then time inside (cProfile counts wall time,
    so a function that waits for PostgreSQL or Redis shows its wait)."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(n):
        answered(call, 202)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime")
    out.write(f"POST …/jobs under cProfile, {n:,} requests: the functions with the most time of"
              " their own (waits included)\n")
    stats.print_stats(top)
    stats.sort_stats("cumulative")
    out.write("\n… and with the most time inside them\n")
    stats.print_stats(top)
    return strip_paths(out.getvalue())


def strip_paths(report: str) -> str:
    """pstats prints each function's whole file path: keep what follows site-packages/ or the
    repository's root."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    lines = []
    for line in report.splitlines():
        if "site-packages/" in line:
            head, _, tail = line.partition("/")
            line = head + tail.split("site-packages/", 1)[1]
        lines.append(line.replace(root, ""))
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
