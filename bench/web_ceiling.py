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
printed beside them (the 404s are the point of the first line), and so are the database sessions
the benchmark's database saw opened during the run (``pg_stat_database.sessions``): a web whose
pool keeps a connection for each busy thread opens none once warm, one that keeps fewer opens and
closes backends all the time. A session still open is counted when its backend reports, at most
10 s late, so a handful more or less is noise.

``--profile [DIR]`` looks at the submit's run from three sides and writes what it saw into DIR
(without one, a new ``.bench/web-profile-<time>-<commit>``, git-ignored):

- ``python.txt`` (and py-spy's collapsed ``stacks.txt``): py-spy with ``--gil`` on the web's
  processes, so only samples in which a request thread held the GIL: their Python work;
- ``waits.txt``: the web's PostgreSQL backends sampled every 10 ms from ``pg_stat_activity``
  (state, wait event, the statement's first line): what the database was doing for them, and
  whether they were waiting for a lock, the disk, or for the web to send the next statement;
- ``cpu.txt``: CPU time over the run from ``/proc``, by process (the web's, PostgreSQL's
  backends, Redis, wrk), as a share of one core;
- ``statements.txt``: the run's statements from ``pg_stat_statements`` (calls, mean time, buffers),
  when the server loads it (bench/README.md, "A server with pg_stat_statements": a private
  server on another port); else a line that says it does not.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from bench.harness import post_script, raw_output_dir, run_wrk
from bench.peers import load_peer
from bench.peers.spacejobs import REQUEST_LIMITS, UNLIMITED
from bench.profile import (
    PY_SPY_MISSING,
    python_report,
    start_py_spy,
    statements_loaded,
    statements_table,
    stop_py_spy,
)
from bench.servers import add_embedded_option, measured_on
from spacejobs.models.db.engine import libpq_url
from spacejobs.models.db.queries import queries_beside
from tests.kit.sampling import QuerySampler

# --profile with no DIR: a directory of its own under .bench/
DEFAULT_PROFILE = Path("<.bench>")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.web_ceiling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8, help="wrk's run per URL")
    parser.add_argument("--connections", type=int, default=32, help="wrk's keep-alive connections")
    parser.add_argument("--workers", type=int, default=2, help="`spacejobs web --workers`")
    parser.add_argument("--profile", type=Path, nargs="?", const=DEFAULT_PROFILE, metavar="DIR",
                        help="where the submit's time goes (Python, the database's waits, CPU), "
                             "into DIR (default: a new directory under .bench/, git-ignored)")
    add_embedded_option(parser)
    args = parser.parse_args(argv)
    if args.profile == DEFAULT_PROFILE:
        args.profile = raw_output_dir("web-profile")
    if args.profile is not None:
        print(f"raw output: {args.profile}", file=sys.stderr, flush=True)
    print(f"spacejobs web --workers {args.workers}, wrk -c{args.connections} for"
          f" {args.seconds:g} s per URL after 1 s of warm-up")
    with measured_on(args.embedded) as (admin_url, redis_url):
        measure(args, admin_url, redis_url)
    return 0


def measure(args: argparse.Namespace, admin_url: str, redis_url: str) -> None:
    peer = load_peer("spacejobs").prepare(admin_url, redis_url, "ceiling" + uuid.uuid4().hex[:6])
    try:
        stack, tenant = peer.stack, peer.tenant
        web, base = stack.start_web(workers=args.workers, **{f"SPACEJOBS_{name}": UNLIMITED
                                                                  for name in REQUEST_LIMITS})
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
            sessions = sessions_opened(stack.admin_url)
            with profiled(web.popen.pid if args.profile and script is post else None, args.profile,
                          stack.admin_url):
                report = run_wrk(url, script, seconds=args.seconds, connections=args.connections)
            time.sleep(1)  # a backend that closed reports its session as it exits, others ~1 s on
            sessions = sessions_opened(stack.admin_url) - sessions - 1  # less our own read's
            print(f"{label:<34} {report.answered / max(1, round(args.seconds)):>7,.0f} requests/s"
                  f"  ({report.answered:,} answered, {report.not_2xx:,} not 2xx,"
                  f" socket errors {report.socket_errors}; {sessions:,} database sessions opened)",
                  flush=True)
            if args.profile and script is post:
                (args.profile / "statements.txt").write_text(
                    statements_during(stack.admin_url, report.answered))
        stack.processes.stop(web)
    finally:
        peer.cleanup()


@contextmanager
def profiled(pid: int | None, out: Path | None, admin_url: str) -> Iterator[None]:
    """py-spy on ``pid`` and its subprocesses, the backends' waits and the CPU by process, for
    the block; the reports into ``out``."""
    if pid is None or out is None:
        yield
        return
    out.mkdir(parents=True, exist_ok=True)
    forget_statements(admin_url)
    spy = start_py_spy(pid, out, rate=250, gil=True)  # without py-spy, the other reports
    waits = WaitSampler(admin_url)
    cpu_before, started = cpu_by_process(), time.monotonic()
    waits.start()
    try:
        yield
    finally:
        seconds = time.monotonic() - started
        cpu_after = cpu_by_process()
        waits.stop()
        if spy is not None:
            stop_py_spy(spy)
    stacks = out / "stacks.txt"
    (out / "python.txt").write_text(
        python_report(stacks, top=60) if stacks.exists() else
        "py-spy recorded nothing: see py-spy.log\n" if spy is not None else PY_SPY_MISSING + "\n")
    (out / "waits.txt").write_text(waits.report())
    (out / "cpu.txt").write_text(cpu_report(cpu_before, cpu_after, seconds))


Q = queries_beside(__file__)
#: one look at the web's backends (web_ceiling.sql says what it reads)
WAITS = str(Q["web_backends"])


def forget_statements(admin_url: str) -> None:
    """Start pg_stat_statements' counts afresh, when the server loads it."""
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        if statements_loaded(conn):
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")


def statements_during(admin_url: str, answered: int) -> str:
    """The statements of the submits' run (pg_stat_statements, reset as it began), or why not."""
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        if not statements_loaded(conn):
            return ("pg_stat_statements is not in this server's shared_preload_libraries:"
                    " bench/README.md says how to run a server that has it\n")
        table, calls, commits = statements_table(conn)
    per = max(answered, 1)
    return "\n".join([f"{answered:,} POSTs answered; statements executed: {calls:,}"
                      f" ({calls / per:.1f} per POST, the function's own inside it included when"
                      f" pg_stat_statements.track = all); commits in this database: {commits:,}", "",
                      *table]) + "\n"


def sessions_opened(admin_url: str) -> int:
    """How many sessions the benchmark's database has seen opened so far."""
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        row = conn.execute(str(Q["sessions_opened"])).fetchone()
    return int(row[0]) if row else 0


class WaitSampler:
    """What the web's backends (``space_app``) are doing, every 10 ms, from pg_stat_activity."""

    def __init__(self, admin_url: str) -> None:
        self.seen: Counter[tuple[str, str, str]] = Counter()
        self.sampler = QuerySampler(admin_url, WAITS, self._count, interval=0.01)

    def _count(self, rows: list[tuple[Any, ...]]) -> None:
        self.seen.update((state or "?", wait, query[:70]) for state, wait, query in rows)

    def start(self) -> None:
        self.sampler.start()

    def stop(self) -> None:
        self.sampler.stop()

    def report(self) -> str:
        total = sum(self.seen.values()) or 1
        lines = [f"{self.sampler.samples} samples of the web's backends (pg_stat_activity, every"
                 f" 10 ms): state | wait | the statement's first line", ""]
        lines += [f"{100 * n / total:5.1f}%  {state} | {wait} | {query}"
                  for (state, wait, query), n in self.seen.most_common(25)]
        return "\n".join(lines) + "\n"


def cpu_by_process() -> dict[int, tuple[str, int]]:
    """Every process's command line and CPU ticks (user + system) so far, from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        found[int(entry.name)] = (command.strip() or stat[stat.find("(") + 1:stat.rfind(")")],
                                  int(fields[11]) + int(fields[12]))
    return found


def cpu_report(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]],
               seconds: float) -> str:
    """CPU over the run by kind of process, as a share of one core."""
    ticks = os.sysconf("SC_CLK_TCK")
    used: Counter[str] = Counter()
    for pid, (command, now) in after.items():
        if command.startswith("postgres:"):
            name = "postgres: " + " ".join(command.split()[2:3])  # the role, or the process
        elif "spacejobs.webapp.cli web" in command:
            name = "spacejobs web (gunicorn)"
        else:
            name = command.split(" ")[0].rsplit("/", 1)[-1]
        used[name] += now - before.get(pid, (command, 0))[1]
    lines = [f"CPU over {seconds:.1f} s, as a share of one core ({os.cpu_count()} on this machine)"]
    lines += [f"{100 * n / ticks / seconds:6.1f}%  {name}" for name, n in used.most_common(12)]
    return "\n".join(lines) + "\n"

if __name__ == "__main__":
    raise SystemExit(main())
