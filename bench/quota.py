"""What the quota costs one organization's submits, through `spacejobs web`.

wrk POSTs `{"kind": "bench.noop"}` with one member's token for a few seconds, three times, with
three versions of admit_jobs() (models/db/schema.sql) installed in turn:

- none:       no quota at all (admit_jobs admits everything without a lock or a count);
- striped:    admit_jobs as built (16 stripes, a lock per organization only near the cap);
- serialized: the plain design, one advisory lock per organization held until commit, then a
              count: every submit of the organization waits for the previous one's commit.

Meanwhile a drainer cancels the organization's queued jobs every 50 ms, as workers would
finish them, so the count stays far below the cap (1,000) and no submit is refused.

    DATABASE_URL=postgresql://postgres@127.0.0.1/postgres REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python -m bench.quota --seconds 10 --connections 32 --workers 2

`--embedded` measures on an embedded PostgreSQL and Redis started for the run instead.
Needs `wrk` (apt-get install wrk). Prints requests/s and the answers that were not 202.

Then the same three versions without the web: `--connections` threads, each with its own
connection as `space_app`, submit one job per transaction (submit_job(), then COMMIT) for the
same time. This is the ceiling the database leaves the web, where a lock held until commit
shows most: each submit waits for the one before it to flush its commit.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg
import requests
from sqlalchemy import text

from bench.harness import WRK_MISSING, have_wrk, poll, post_script, run_wrk
from bench.servers import add_embedded_option, measured_on

ROOT = Path(__file__).resolve().parent.parent

NO_QUOTA = """
CREATE OR REPLACE FUNCTION admit_jobs(p_organization_id uuid, p_kinds text[],
    p_kind_caps integer[], p_org_cap integer, p_first_write boolean)
RETURNS TABLE (refused_kind text, cap integer)
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$ BEGIN RETURN; END $$
"""

SERIALIZED = """
CREATE OR REPLACE FUNCTION admit_jobs(p_organization_id uuid, p_kinds text[],
    p_kind_caps integer[], p_org_cap integer, p_first_write boolean)
RETURNS TABLE (refused_kind text, cap integer)
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('spacejobs.quota-one:' || p_organization_id::text));
    RETURN QUERY SELECT r.refused_kind, r.cap
                 FROM quota_refusal(p_organization_id, p_kinds, p_kind_caps, p_org_cap, 0) AS r;
END $$
"""


def submits_per_second(db_url: str, org: uuid.UUID, user: uuid.UUID, connections: int,
                       seconds: float) -> float:
    """``connections`` threads submitting one job per transaction as space_app, for ``seconds``."""
    from spacejobs.models.db.engine import libpq_url
    from spacejobs.models.db.roles import APP_ROLE, role_url

    done: list[int] = []
    stop_at = time.monotonic() + seconds

    def submitter() -> None:
        count = 0
        with psycopg.connect(libpq_url(role_url(APP_ROLE, db_url))) as conn:
            while time.monotonic() < stop_at:
                with conn.transaction():
                    conn.execute(
                        "SELECT * FROM submit_job(%s, %s, 'bench.noop', '{}', 3, 30,"
                        " ARRAY['active'], 'member', NULL, NULL, NULL, NULL, NULL, 1000, NULL, 0)",
                        (org, user)).fetchall()
                count += 1
        done.append(count)

    threads = [threading.Thread(target=submitter) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn processes")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of the three versions, in turn (figures: the median)")
    add_embedded_option(parser)
    args = parser.parse_args()
    if not have_wrk():
        sys.exit(WRK_MISSING)
    os.environ["SPACEJOBS_BENCH_KINDS"] = "1"
    with measured_on(args.embedded) as (server, redis_url):
        measure_all(args, server, redis_url)


def measure_all(args: argparse.Namespace, server: str, redis_url: str) -> None:
    """The three versions through the web, then without it, on the given servers."""

    from spacejobs.models.db.engine import make_engine
    from spacejobs.models.db.transaction import owner_transaction
    from tests.kit import broker, seeding
    from tests.kit.processes import free_port
    from tests.kit.servers import Servers

    name = f"sj_quota_{uuid.uuid4().hex[:8]}"
    queue = f"sj-quota-{uuid.uuid4().hex[:8]}"
    servers = Servers(server, redis_url, "DATABASE_URL / REDIS_URL")
    db_url = servers.create_database(name, template=servers.migrated_template())
    web = None
    stop = threading.Event()
    admin = None
    try:
        admin = make_engine(db_url, pool_size=2)
        # The default quota applies: this measures what it costs.
        org = seeding.organization(admin, "quota-bench")
        user = seeding.user(admin, org, "member")
        token = user.token
        with owner_transaction(admin, actor="bench") as conn:
            built = conn.execute(text("SELECT pg_get_functiondef('admit_jobs'::regproc)")).scalar_one()

        port = free_port()
        env = dict(os.environ, DATABASE_URL=db_url, REDIS_URL=redis_url, SPACEJOBS_QUEUE=queue,
                   SPACEJOBS_BENCH_KINDS="1", SPACEJOBS_SUBMIT_RATE_LIMIT="100000000 per minute",
                   SPACEJOBS_ORG_SUBMIT_RATE_LIMIT="100000000 per minute",
                   PYTHONPATH=str(ROOT))
        web = subprocess.Popen(
            [sys.executable, "-m", "spacejobs.webapp.cli", "web", "--port", str(port), "--workers",
             str(args.workers)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        url = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            try:
                requests.get(url + "/api/v1/me", timeout=1)
            except requests.ConnectionError:
                return False
            return True

        poll(answers, 30, interval=0.2)

        def drain() -> None:
            while not stop.wait(0.05):
                with owner_transaction(admin, actor="bench") as conn:
                    conn.execute(text("UPDATE jobs SET status = 'cancelled'"
                                      " WHERE organization_id = :org AND status = 'queued'"),
                                 {"org": org})

        drainer = threading.Thread(target=drain, daemon=True)
        drainer.start()
        script = post_script(Path(tempfile.mkdtemp()), "post", '{"kind": "bench.noop"}', token)
        target = f"{url}/api/v1/orgs/{org}/jobs"
        print(f"POST {target.replace(str(org), '{org}')}: one organization, one token, "
              f"{args.connections} connections, {args.workers} gunicorn processes x 16 threads, "
              f"{args.seconds} s each")
        versions = (("none", NO_QUOTA), ("striped", built), ("serialized", SERIALIZED))
        figures: dict[str, list[tuple[float, str, str, int]]] = {label: [] for label, _ in versions}
        for round_ in range(args.rounds):
            for label, definition in versions[round_ % 3:] + versions[:round_ % 3]:
                with owner_transaction(admin, actor="bench") as conn:
                    conn.execute(text(definition))
                run_wrk(target, script, seconds=2, connections=args.connections)  # warm-up
                run = run_wrk(target, script, seconds=args.seconds, connections=args.connections,
                              latency=True)
                figures[label].append((run.requests_per_second, run.p50, run.p99, run.not_2xx))
                print(f"  round {round_ + 1} {label:<11} {figures[label][-1][0]:8.1f} submits/s",
                      flush=True)
        direct: dict[str, list[float]] = {label: [] for label, _ in versions}
        for round_ in range(args.rounds):
            for label, definition in versions[round_ % 3:] + versions[:round_ % 3]:
                with owner_transaction(admin, actor="bench") as conn:
                    conn.execute(text(definition))
                direct[label].append(submits_per_second(db_url, org, user.id, args.connections,
                                                        args.seconds))
                print(f"  round {round_ + 1} {label:<11} {direct[label][-1]:8.1f} submits/s "
                      "(database only)", flush=True)
        print("median of the rounds:")
        for label, runs in figures.items():
            rate, p50, p99, _ = sorted(runs)[len(runs) // 2]
            print(f"  {label:<11} {rate:8.1f} submits/s   p50 {p50:>8}  p99 {p99:>8}   "
                  f"not 202: {sum(r[3] for r in runs)}   (all: "
                  f"{', '.join(f'{r[0]:.0f}' for r in runs)})")
        for label, rates in direct.items():
            print(f"  {label:<11} {sorted(rates)[len(rates) // 2]:8.1f} submits/s database only "
                  f"(all: {', '.join(f'{r:.0f}' for r in rates)})")
    finally:
        stop.set()
        if web is not None:
            os.killpg(web.pid, 15)
            web.wait(timeout=20)
        if admin is not None:
            admin.dispose()
        servers.drop_database(name)
        servers.close()  # the template
        broker.redis_client(redis_url).delete(queue)


if __name__ == "__main__":
    main()
