"""Requests per second through `spacejobs web`, from what costs nothing to a submit, in one run:
the stack's own ceiling on this machine beside what each step of a request adds.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python -m bench.web_ceiling [--seconds 8] [--connections 32] [--workers 2]
    .venv/bin/python -m bench.web_ceiling --embedded ...   # on servers started for the run

One `spacejobs web --workers N` (gunicorn gthread, every request limit lifted so that each is
counted but none refuses), then wrk with keep-alive connections and one member's bearer token,
each URL after a short warm-up:

- a URL that does not exist: Flask's 404, no database, no Redis. No request of ours can be
  served faster than this: it is the ceiling of Flask and gunicorn on this machine;
- ``GET /api/v1/me``: the token checked and the user's memberships read, one transaction;
- ``GET /api/v1/orgs/{org}/projects``: the token, the membership and one read of the organization;
- ``POST /api/v1/orgs/{org}/jobs`` of ``bench.noop``: a submit (no worker runs).

Requests per second are wrk's answered requests over its run; the answers that were not 2xx are
printed beside them (the 404s are the point of the first line).
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
from pathlib import Path

from bench.harness import post_script, run_wrk
from bench.peers import load_peer
from bench.peers.spacejobs import UNLIMITED
from bench.servers import add_embedded_option, measured_on

LIMITS = ("SPACEJOBS_SUBMIT_RATE_LIMIT", "SPACEJOBS_ORG_SUBMIT_RATE_LIMIT",
          "SPACEJOBS_API_RATE_LIMIT", "SPACEJOBS_POLL_RATE_LIMIT")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.web_ceiling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8, help="wrk's run per URL")
    parser.add_argument("--connections", type=int, default=32, help="wrk's keep-alive connections")
    parser.add_argument("--workers", type=int, default=2, help="`spacejobs web --workers`")
    add_embedded_option(parser)
    args = parser.parse_args(argv)
    print(f"spacejobs web --workers {args.workers}, wrk -c{args.connections} for"
          f" {args.seconds:g} s per URL after 1 s of warm-up")
    with measured_on(args.embedded) as (admin_url, redis_url):
        measure(args, admin_url, redis_url)
    return 0


def measure(args: argparse.Namespace, admin_url: str, redis_url: str) -> None:
    peer = load_peer("spacejobs").prepare(admin_url, redis_url, "ceiling" + uuid.uuid4().hex[:6])
    try:
        stack, tenant = peer.stack, peer.tenant
        web, base = stack.start_web(workers=args.workers, **dict.fromkeys(LIMITS, UNLIMITED))
        scripts = Path(tempfile.mkdtemp(prefix="sj-ceiling-"))
        get = scripts / "get.lua"
        get.write_text(f'wrk.headers["Authorization"] = "Bearer {tenant.member.token}"\n')
        post = post_script(scripts, "post", '{"kind": "bench.noop"}', tenant.member.token)
        org = f"{base}/api/v1/orgs/{tenant.organization_id}"
        urls = [("a URL that does not exist (404)", f"{base}/nothing", get),
                ("GET /api/v1/me", f"{base}/api/v1/me", get),
                ("GET …/projects", f"{org}/projects", get),
                ("POST …/jobs", f"{org}/jobs", post)]
        for label, url, script in urls:
            run_wrk(url, script, seconds=1, connections=args.connections)  # warm-up
            report = run_wrk(url, script, seconds=args.seconds, connections=args.connections)
            print(f"{label:<34} {report.answered / max(1, round(args.seconds)):>7,.0f} requests/s"
                  f"  ({report.answered:,} answered, {report.not_2xx:,} not 2xx,"
                  f" socket errors {report.socket_errors})", flush=True)
        stack.processes.stop(web)
    finally:
        peer.cleanup()


if __name__ == "__main__":
    raise SystemExit(main())
