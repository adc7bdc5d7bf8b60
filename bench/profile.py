"""Profile a drain: where the time goes, in Python (py-spy) and in SQL (pg_stat_statements).

    .venv/bin/python -m bench.profile --server postgresql://postgres@127.0.0.1:5433/postgres \\
        --redis redis://127.0.0.1:6379/0 --jobs 5000 [--out DIR]

The server must load pg_stat_statements (``shared_preload_libraries``) and the URL must be a
superuser's (it creates the extension and reads every role's statements); a private PostgreSQL
on another port is the easy way (bench/README.md, "A server with pg_stat_statements"). It fills
one organization with N ``bench.noop`` jobs, starts one worker (``-c 2``, prefork), attaches
py-spy once it is ready, wakes it, waits until every job is finished, and writes into ``--out``
(by default a new ``.bench/profile-<time>-<commit>``, git-ignored):

- ``stacks.txt``: py-spy's collapsed stacks of the worker's processes during the drain (load
  it in speedscope.app or flamegraph.pl), and ``python.txt``: the functions with the most
  samples, inclusive and on their own;
- ``statements.txt``: the statements by total execution time, with calls, rows and mean time,
  and per job the number of statements, commits and rows written by triggers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from bench import rows
from bench.harness import poll, raw_output_dir
from spacejobs.models.db.engine import libpq_url, make_engine
from tests.kit import seeding
from tests.kit.servers import Servers

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True, help="superuser URL, pg_stat_statements loaded")
    parser.add_argument("--redis", required=True)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--out", type=Path, help="where the raw output goes (default: a new "
                                                 "directory under .bench/, git-ignored)")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    args = parser.parse_args(argv)
    args.out = args.out or raw_output_dir("profile")
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"raw output: {args.out}", file=sys.stderr, flush=True)

    name = f"sj_profile_{uuid.uuid4().hex[:8]}"
    queue = f"sj-profile-{uuid.uuid4().hex[:8]}"
    servers = Servers(args.server, args.redis, "--server / --redis")
    db_url = servers.create_database(name, template=servers.migrated_template())
    spy = worker = None
    # Kept open for the drain's poll: connected (and SQLAlchemy's first-connect queries run)
    # before pg_stat_statements is reset, so the report counts only the drain's statements.
    admin = make_engine(db_url, pool_size=1)
    try:
        org = seeding.organization(admin, "profile")
        user = seeding.user(admin, org, "member")
        with psycopg.connect(libpq_url(db_url), autocommit=True) as conn:
            # Owner-role rows, the same shape submit writes (bench.noop, 3 attempts, 30 s lease).
            conn.execute("SET ROLE space_owner")
            conn.execute(
                "INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds, max_attempts)"
                " SELECT %s, %s, 'bench.noop', 30, 3 FROM generate_series(1, %s)",
                (org, user.id, args.jobs))
            conn.execute("RESET ROLE")
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("VACUUM ANALYZE jobs")
            conn.execute("SELECT pg_stat_statements_reset()")

        env = dict(os.environ, DATABASE_URL=db_url, REDIS_URL=args.redis, SPACEJOBS_QUEUE=queue,
                   SPACEJOBS_BENCH_KINDS="1", PYTHONPATH=str(ROOT))
        for variable in ("SPACEJOBS_APP_DATABASE_URL", "SPACEJOBS_WORKER_DATABASE_URL"):
            env.pop(variable, None)
        log_path = args.out / "worker.log"
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "spacejobs.tasks.celery_app", "worker", "--loglevel",
             "INFO", "-c", str(args.concurrency), "-Q", queue, "-n", f"profile-{queue}@%h",
             "--without-mingle", "--without-gossip"],
            env=env, cwd=ROOT, stdout=log_path.open("wb"), stderr=subprocess.STDOUT,
            start_new_session=True)
        # The worker's start-up (imports, forking the pool) is not what we profile: attach once
        # it says it is ready.
        def started_up() -> bool:
            if worker.poll() is not None:
                raise SystemExit("the worker did not start; see worker.log")
            return " ready." in log_path.read_text(errors="replace")

        if not poll(started_up, 120):
            raise SystemExit("the worker did not start; see worker.log")
        spy = start_py_spy(worker.pid, args.out, rate=args.rate)
        if spy is None:
            raise SystemExit(PY_SPY_MISSING)
        time.sleep(1)  # py-spy attaches to every process of the group
        from spacejobs.tasks.wakeups import WakeupPublisher

        publisher = WakeupPublisher(args.redis, queue)
        started = time.monotonic()
        for _ in range(args.concurrency):
            publisher.wake()
        seen: list[rows.Progress] = []
        # Autocommit: the poll is one statement a time in pg_stat_statements, no BEGIN around it.
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            def drained() -> bool:
                seen.append(rows.progress(conn))
                return seen[-1].completed >= args.jobs

            def still_working() -> None:
                if worker.poll() is not None:
                    raise SystemExit("the worker exited; see worker.log")
                publisher.wake()

            if not poll(drained, max(120, args.jobs / 20) - (time.monotonic() - started),
                        interval=0.2, between=still_working):
                raise SystemExit(f"only {seen[-1].completed}/{args.jobs} finished")
        seconds = (seen[-1].last_finished - seen[-1].first_started).total_seconds()
        stop_py_spy(spy)
        spy = None
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
        worker = None
        (args.out / "python.txt").write_text(python_report(args.out / "stacks.txt"))
        report = statements_report(db_url, args.jobs, seconds)
        (args.out / "statements.txt").write_text(report)
        print(report)
        return 0
    finally:
        for process in (spy, worker):
            if process is not None:
                os.killpg(process.pid, signal.SIGKILL)
        admin.dispose()
        servers.drop_database(name)
        servers.close()  # the template


#: what a profile says, or exits with, when py-spy is not there to record
PY_SPY_MISSING = "py-spy is not installed: pip install -e '.[bench]'"


def start_py_spy(pid: int, out: Path, *, rate: int, gil: bool = False
                 ) -> subprocess.Popen[bytes] | None:
    """py-spy recording ``pid`` and its subprocesses until :func:`stop_py_spy`: collapsed
    stacks into ``out/stacks.txt``, its own messages into ``out/py-spy.log``; ``gil``: only
    the samples in which a thread holds the GIL (Python's work, not its waits). None when
    py-spy is not installed (it comes with the bench extra)."""
    spy_bin = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy_bin is None:
        return None
    return subprocess.Popen(
        [spy_bin, "record", "--subprocesses", *(["--gil"] if gil else []), "--rate", str(rate),
         "--nonblocking", "-o", str(out / "stacks.txt"), "-f", "raw", "--pid", str(pid)],
        stdout=subprocess.DEVNULL, stderr=(out / "py-spy.log").open("wb"),
        start_new_session=True)


def stop_py_spy(spy: subprocess.Popen[bytes]) -> None:
    """End a recording: py-spy writes its stacks on SIGINT."""
    os.killpg(spy.pid, signal.SIGINT)
    spy.wait(timeout=60)


def python_report(stacks: Path, top: int = 30) -> str:
    """Samples per function: inclusive (anywhere on the stack) and self (on top), busy samples
    only (a process waiting for its next message is idle, not slow)."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in stacks.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if not count.isdigit():
            # Not a sample: a line that does not end in its count (seen once in a run of the
            # web under wrk: a line ending '2";', a piece of a process's command line, which
            # py-spy writes as each sample's first frame).
            continue
        names = [f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] + ")"
                 for f in frames.split(";")[1:]]
        if not names or any(n.startswith(("_brpop", "wait (threading", "select (selectors"))
                            for n in names[-2:]):
            continue
        total += int(count)
        for name in set(names):
            inclusive[name] = inclusive.get(name, 0) + int(count)
        own[names[-1]] = own.get(names[-1], 0) + int(count)
    lines = [f"{total} busy samples", "", "inclusive:"]
    lines += [f"{100 * n / total:6.1f}%  {name}" for name, n in
              sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]]
    lines += ["", "self:"]
    lines += [f"{100 * n / total:6.1f}%  {name}" for name, n in
              sorted(own.items(), key=lambda kv: -kv[1])[:top]]
    return "\n".join(lines) + "\n"


def statements_report(db_url: str, jobs: int, seconds: float) -> str:
    with psycopg.connect(libpq_url(db_url), autocommit=True) as conn:
        table, calls, commits = statements_table(conn)
    return "\n".join([f"drain of {jobs} bench.noop jobs: {seconds:.2f} s = {jobs / seconds:,.0f} jobs/s",
                      f"statements executed: {calls} ({calls / jobs:.1f} per job); commits in this"
                      f" database (including the set-up): {commits} ({commits / jobs:.2f} per job)",
                      "", *table]) + "\n"


def statements_loaded(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server loads pg_stat_statements, which only a restart can change."""
    row = conn.execute("SELECT 'pg_stat_statements' = ANY (string_to_array("
                       "replace(current_setting('shared_preload_libraries'), ' ', ''), ','))"
                       ).fetchone()
    return bool(row and row[0])


def statements_table(conn: psycopg.Connection[Any], top: int = 25) -> tuple[list[str], int, int]:
    """The lines of the current database's statements by total execution time (with calls,
    rows, mean time, buffers and WAL records per row, JIT functions), the statements executed
    and the commits in this database: ``conn`` is a superuser's, on that database."""
    statements = conn.execute(
        "SELECT calls, rows, total_exec_time, mean_exec_time,"
        "       shared_blks_hit + shared_blks_read, wal_records, jit_functions,"
        "       regexp_replace(query, '\\s+', ' ', 'g')"
        " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
        " WHERE d.datname = current_database() ORDER BY total_exec_time DESC LIMIT %s",
        (top,)).fetchall()
    calls = conn.execute(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d"
        " ON d.oid = s.dbid WHERE d.datname = current_database()").fetchone()
    commits = conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()
    lines = ["Buffers and WAL records per row the statement returned or changed (per call when"
             " it returned none): counted by PostgreSQL, so steady on a busy machine where the"
             " times are not.", "",
             "jit: functions LLVM compiled for the statement, all calls together (0 is what OLTP"
             " statements want: compiling costs more than they run).", "",
             f"{'calls':>8} {'rows':>8} {'total ms':>10} {'mean ms':>8} {'blks/row':>8} {'wal/row':>8}"
             f" {'jit':>5}  statement"]
    for call_count, row_count, total, mean, blocks, wal, jit, query in statements:
        per_row = row_count or max(call_count, 1)  # a statement that returns no rows: per call
        lines.append(f"{call_count:>8} {row_count:>8} {total:>10.1f} {mean:>8.3f}"
                     f" {blocks / per_row:>8.1f} {wal / per_row:>8.1f} {jit:>5}  {query[:150]}")
    return lines, int(calls[0]) if calls else 0, int(commits[0]) if commits else 0

if __name__ == "__main__":
    sys.exit(main())
