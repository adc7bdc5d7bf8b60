"""What one single submit (``submit_jobs()`` of one job) costs the database, part by part.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python -m bench.submit_parts [--seconds 5] [--rounds 3]

In a scratch copy of the migrated database (one organization, one owner), ``pgbench -M
prepared`` on one connection, as the superuser, times the statement the enqueue figure runs
(``submit_jobs()`` of one job with the default quota of active jobs) beside variants that each leave ONE
part out: the function and the insert trigger are replaced in the scratch copy only, by
their own text with one statement taken away (or the quota's cap not passed). Then the job's
row alone (``INSERT INTO jobs`` with its keys, indexes and statement trigger, none of the
function's checks) and a plain one-row INSERT into a table of its own. Each round runs every
variant in turn on an emptied table; the report is each one's mean latency per round and their
median. Nothing is judged: the figures say where a submit's time goes in the database.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg

from spacejobs.models.db.engine import libpq_url, make_engine
from tests.kit import seeding
from tests.kit.servers import find_or_start

SUBMIT = ("SELECT outcome, id FROM submit_jobs(p_organization_id => '{org}', p_requested_by => "
          "'{user}', p_org_states => ARRAY['active'], p_role => 'member', p_request_id => NULL, "
          "p_ids => ARRAY[gen_random_uuid()], p_kinds => ARRAY['bench.noop'], "
          "p_params => ARRAY['{{}}'::jsonb], p_max_attempts => ARRAY[3], "
          "p_lease_seconds => ARRAY[60], p_dedup_keys => ARRAY[NULL::text], "
          "p_run_afters => ARRAY[NULL::timestamptz], p_org_quota => NULL, "
          "p_kind_quotas => ARRAY[{quota}::integer], p_priorities => ARRAY[0], p_bulk => false);\n")
JOB_ROW = ("INSERT INTO jobs (organization_id, requested_by, kind, params, max_attempts, "
           "lease_seconds) VALUES ('{org}', '{user}', 'bench.noop', '{{}}', 3, 60);\n")
PLAIN = "INSERT INTO submit_parts_plain (payload) VALUES ('{{}}');\n"


def without(definition: str, start: str, replacement: str, *, after: str = "") -> str:
    """``definition`` with the statement that begins with ``start`` (the first one after
    ``after``) replaced by ``replacement``."""
    begin = definition.index(start, definition.index(after) if after else 0)
    end = definition.index(";", begin)
    return definition[:begin] + replacement + definition[end:]


def cut(definition: str, start: str, end: str) -> str:
    """``definition`` without the text from ``start`` up to ``end`` (kept)."""
    begin = definition.index(start)
    return definition[:begin] + definition[definition.index(end, begin):]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.submit_parts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5, help="pgbench's run per variant")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    servers = find_or_start()
    name = f"sj_parts_{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="sj-parts-"))
    try:
        url = libpq_url(servers.create_database(name, template=servers.migrated_template()))
        admin = make_engine(url, pool_size=1)
        try:
            org = seeding.organization(admin, "parts")
            user = seeding.user(admin, org, "owner").id
        finally:
            admin.dispose()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE submit_parts_plain (id bigserial PRIMARY KEY, payload jsonb,"
                         " created_at timestamptz DEFAULT now())")
            submit_jobs, after_insert = (
                conn.execute(f"SELECT pg_get_functiondef('{f}'::regproc)").fetchone()[0]
                for f in ("submit_jobs", "jobs_after_insert"))

            def script(text: str) -> Path:
                path = work / f"{uuid.uuid4().hex}.sql"
                path.write_text(text.format(org=org, user=user, quota=100_000_000))
                return path

            submit = script(SUBMIT)
            original = [submit_jobs, after_insert]
            # name: (the statement pgbench runs, the definitions it runs with)
            variants: dict[str, tuple[Path, list[str]]] = {
                "submit_jobs() of one, as the enqueue runs it": (submit, original),
                "  without the quota's count": (script(SUBMIT.replace("{quota}", "NULL")),
                                                original),
                "  without the membership's FOR SHARE": (submit, [
                    without(submit_jobs, "FOR SHARE OF m, o", ""), after_insert]),
                "  without the audit row": (submit, [
                    cut(submit_jobs, "), audited AS (", "    )\n    SELECT 'created'"),
                    after_insert]),
                "  without the event row": (submit, [
                    submit_jobs, without(after_insert, "INSERT INTO job_events", "PERFORM 1")]),
                "  without the active count": (submit, [
                    submit_jobs, without(after_insert, "PERFORM add_active_jobs", "PERFORM 1")]),
                "  without the NOTIFY": (submit, [
                    submit_jobs, without(after_insert, "PERFORM pg_notify('spacejobs_jobs'", "NULL")]),
                "the job's row alone (INSERT INTO jobs)": (script(JOB_ROW), original),
                "a plain one-row INSERT": (script(PLAIN), original),
            }
            times: dict[str, list[float]] = {label: [] for label in variants}
            try:
                for _ in range(args.rounds):
                    for label, (statement, definitions) in variants.items():
                        for definition in definitions:
                            conn.execute(definition)
                        conn.execute("TRUNCATE jobs, submit_parts_plain CASCADE")
                        conn.execute("CHECKPOINT")
                        times[label].append(pgbench(url, statement, args.seconds))
            finally:
                for definition in original:
                    conn.execute(definition)
        print(f"submit_jobs() of one by part: pgbench -M prepared, one connection, {args.seconds:g} s a"
              f" variant, {args.rounds} rounds; mean ms a statement (median, then each round)")
        width = max(map(len, variants))
        for label, values in times.items():
            each = ", ".join(f"{v:.3f}" for v in values)
            print(f"{label:<{width}}  {statistics.median(values):.3f}  ({each})")
    finally:
        servers.drop_database(name)
        servers.close()
    return 0


def pgbench(url: str, statement: Path, seconds: float,
            run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> float:
    """pgbench's mean latency in ms for ``statement`` over ``seconds``, one connection."""
    done = run(["pgbench", "-n", "-M", "prepared", "-c", "1", "-T", str(max(1, round(seconds))),
                "-f", str(statement), url], capture_output=True, text=True, check=True)
    for line in done.stdout.splitlines():
        if line.startswith("latency average = "):
            return float(line.split("=")[1].split()[0])
    raise RuntimeError(f"pgbench printed no latency:\n{done.stdout}\n{done.stderr}")


if __name__ == "__main__":
    raise SystemExit(main())
