"""Flow control, measured: a rate limit under 16 claiming processes, sequences, fair shares by
time, and what all of it costs the claim.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python -m bench.flow_control [--window 10] [--fair-seconds 60] [--finished 1000000]

Each part runs against the real claim (``store.claim_batch`` as the worker role, the statement
every worker runs) in separate processes, each a "slot": it claims, holds the job for its
duration (params ``seconds``), and finishes it with the fenced finish. No Celery here: this
measures the claim's decisions and costs, not the broker. What it prints, and the targets:

- rate limit: 16 processes claim one organization's kind limited to 50 per ``--window`` s with
  2,000 of its jobs queued; the most leases in any window (target: at most 50), and another
  organization's jobs of the same kind drained alongside (target: at least 0.8 of its rate
  alone);
- sequences: 200 keys x 20 jobs of random durations (0-4 ms); no two of a key overlap and the
  order is the submit order (target: both, and a drain at least 0.8 of the same jobs without
  keys);
- fairness by time: organization A floods 2 s jobs, B 50 ms jobs, weights 2 and 1, 8 slots
  for ``--fair-seconds``; each one's share of the busy time (target: within 10% of 2/3 and
  1/3), then B submits one job every 0.2 s while A's flood runs: B's wait p95 (target: within
  the stated bound, one A job's length plus one claim, 2.1 s);
- claim cost: one claim of 10 jobs with no limit, sequence or debounce in the database, then
  with rate limits on other organizations and kinds and sequence-keyed jobs queued (target:
  at most 1.2x), and again behind ``--finished`` finished rows (target: flat, at most 1.2x).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.harness import percentile
from spacejobs.models.db.engine import make_engine
from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import store
from spacejobs.models.kinds import RateLimit, load_kinds
from spacejobs.models.tenancy import accounts
from tests.kit.servers import Servers, find_or_start
from tests.kit.stack import Stack, running_stack

KIND, OTHER_KIND = "bench.noop", "bench.sleep"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FALL SHORT"


# -- the slots ---------------------------------------------------------------------------------

def _slot(worker_url: str, name: str, until: float, batch: int) -> None:
    """Claim, hold each job its ``seconds``, finish it; until ``until`` (epoch seconds)."""
    engine = make_engine(worker_url, pool_size=1)
    after = store.NO_ORGANIZATION  # the turn among organizations, kept as a worker keeps it
    while time.time() < until:
        with transaction(engine, actor=f"worker:{name}") as conn:
            taken = store.claim_batch(conn, name, limit=batch, controls=[],
                                      after_organization=after)
        after = taken.next_organization
        if not taken:
            time.sleep(0.002)
            continue
        for job in taken:
            time.sleep(float(job.params.get("seconds", 0)))
            with transaction(engine, actor=f"worker:{name}") as conn:
                store.complete_batch(conn, [(job.id, job.lease_token, None, None)])
    engine.dispose()


def run_slots(stack: Stack, slots: int, seconds: float, batch: int = 1) -> None:
    until = time.time() + seconds
    procs = [multiprocessing.Process(target=_slot, args=(stack.worker_url, f"slot{i}", until, batch))
             for i in range(slots)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()


def queue(stack: Stack, org: uuid.UUID, user: uuid.UUID, count: int, *, kind: str = KIND,
          seconds: Sequence[float] | None = None, keys: Sequence[str | None] | None = None) -> None:
    """Queued jobs as submit makes them (one statement, through the owner role), in order."""
    durations = list(seconds) if seconds is not None else [0.0] * count
    sequence = list(keys) if keys is not None else [None] * count
    with stack.admin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (organization_id, requested_by, kind, lease_seconds, max_attempts,"
            " params, sequence_key, sequence_position, created_at, run_after)"
            " SELECT :org, :user, :kind, 60, 3, jsonb_build_object('seconds', d.s), d.k,"
            "        CASE WHEN d.k IS NOT NULL THEN nextval('job_sequence_positions') END,"
            "        clock_timestamp(), now()"
            " FROM (SELECT * FROM unnest(CAST(:secs AS float8[]), CAST(:keys AS text[]))"
            "       WITH ORDINALITY AS u (s, k, n) ORDER BY u.n) AS d"),
            {"org": org, "user": user, "kind": kind, "secs": durations, "keys": sequence})


def empty(stack: Stack) -> None:
    with stack.admin() as conn:
        conn.execute(text("DELETE FROM jobs"))
        conn.execute(text("DELETE FROM job_rate_limits"))
        conn.execute(text("DELETE FROM rate_limit_windows"))


def leases(stack: Stack, org: uuid.UUID) -> list[tuple[str, Any, Any, Any]]:
    """(key, place, first lease, finish) of each of the organization's jobs."""
    with stack.admin() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT j.sequence_key, j.sequence_position,"
            "       (SELECT min(e.at) FROM job_history e WHERE e.job_id = j.id"
            "          AND e.to_status = 'leased'), j.finished_at"
            " FROM jobs j WHERE j.organization_id = :org"), {"org": org})]


def most_in_window(moments: list[Any], window: timedelta) -> int:
    ordered = sorted(moments)
    best, low = 0, 0
    for high, moment in enumerate(ordered):
        while ordered[low] <= moment - window:
            low += 1
        best = max(best, high - low + 1)
    return best


def drain_rate(rows: list[tuple[str, Any, Any, Any]]) -> float:
    """Jobs finished per second, from the first lease to the last finish."""
    done = [r for r in rows if r[3] is not None]
    if len(done) < 2:
        return 0.0
    span = (max(r[3] for r in done) - min(r[2] for r in done)).total_seconds()
    return len(done) / span if span > 0 else 0.0


def tenant(stack: Stack) -> tuple[uuid.UUID, uuid.UUID]:
    org = stack.org()
    return org, stack.user(org, role="owner").id


# -- the parts ---------------------------------------------------------------------------------

def rate_limit(stack: Stack, window: int, claimers: int) -> list[bool]:
    empty(stack)
    other, other_user = tenant(stack)
    queue(stack, other, other_user, 2000)
    run_slots(stack, claimers, 3.0, batch=4)
    alone = drain_rate(leases(stack, other))

    empty(stack)
    limited, user = tenant(stack)
    other, other_user = tenant(stack)
    with stack.admin() as conn:
        accounts.set_rate_limit(conn, limited, KIND, RateLimit(50, window))
    queue(stack, limited, user, 2000)
    queue(stack, other, other_user, 2000)
    seconds = 2.5 * window
    run_slots(stack, claimers, seconds, batch=4)
    starts = [r[2] for r in leases(stack, limited) if r[2] is not None]
    most = most_in_window(starts, timedelta(seconds=window))
    beside = drain_rate(leases(stack, other))
    ratio = beside / alone if alone else 0.0
    print(f"rate limit 50 per {window} s, {claimers} claiming processes, 2,000 queued: "
          f"{len(starts)} started in {seconds:.0f} s, at most {most} in any {window} s window")
    print(f"  another organization's jobs of the kind: {beside:,.0f} jobs/s beside the limited "
          f"flood, {alone:,.0f} alone ({ratio:.2f}x)")
    print(f"target 19a at most 50 start in any window: {most} {verdict(most <= 50)}")
    print(f"target 19b other organizations not slowed (>= 0.8x alone): {ratio:.2f}x "
          f"{verdict(ratio >= 0.8)}")
    return [most <= 50, ratio >= 0.8]


def sequences(stack: Stack, slots: int, keys_n: int = 200, per_key: int = 20) -> list[bool]:
    rates = {}
    for keyed in (False, True):
        empty(stack)
        org, user = tenant(stack)
        rng = random.Random(19)
        keys = [f"key-{k}" for _ in range(per_key) for k in range(keys_n)]
        queue(stack, org, user, len(keys), seconds=[rng.uniform(0, 0.004) for _ in keys],
              keys=keys if keyed else None)
        began = time.monotonic()
        deadline = began + 120
        done = 0
        procs_until = time.time() + 120
        procs = [multiprocessing.Process(target=_slot, args=(stack.worker_url, f"seq{i}",
                                                                 procs_until, 1))
                 for i in range(slots)]
        for proc in procs:
            proc.start()
        while time.monotonic() < deadline:
            time.sleep(0.2)
            done = stack.job_counts(org)["completed"]
            if done == len(keys):
                break
        elapsed = time.monotonic() - began
        for proc in procs:
            proc.terminate()
            proc.join()
        rates[keyed] = done / elapsed
        rows = leases(stack, org)
    by_key: dict[str, list[tuple[Any, Any, Any]]] = defaultdict(list)
    for key, place, leased, finished in rows:
        by_key[key].append((place, leased, finished))
    overlaps = disorders = 0
    for runs in by_key.values():
        runs.sort()
        for (_, _, ended), (_, began_next, _) in pairwise(runs):
            if ended is None or began_next is None or began_next < ended:
                overlaps += 1
        starts = [leased for _, leased, _ in runs]
        disorders += sum(1 for a, b in pairwise(starts) if a and b and b < a)
    ratio = rates[True] / rates[False] if rates[False] else 0.0
    print(f"sequences, {keys_n} keys x {per_key} jobs, {slots} slots: {rates[True]:,.0f} jobs/s keyed, "
          f"{rates[False]:,.0f} without keys ({ratio:.2f}x); {overlaps} overlaps, "
          f"{disorders} out of order")
    print(f"target 19c no overlap and submit order within a key: {overlaps} overlaps, {disorders}"
          f" out of order {verdict(overlaps == 0 and disorders == 0)}")
    print(f"target 19d keyed drain >= 0.8x unkeyed: {ratio:.2f}x {verdict(ratio >= 0.8)}")
    return [overlaps == 0 and disorders == 0, ratio >= 0.8]


def fairness(stack: Stack, seconds: float, slots: int) -> list[bool]:
    empty(stack)
    a, a_user = tenant(stack)
    b, b_user = tenant(stack)
    with stack.admin() as conn:
        accounts.set_claim_weight(conn, a, 2)
    queue(stack, a, a_user, int(seconds * slots), seconds=[2.0] * int(seconds * slots))
    queue(stack, b, b_user, int(seconds * slots * 20), seconds=[0.05] * int(seconds * slots * 20))
    began = time.time()
    run_slots(stack, slots, seconds)
    busy = {}
    with stack.admin() as conn:
        for name, org in (("A", a), ("B", b)):
            busy[name] = conn.execute(text(
                "SELECT coalesce(sum(extract(epoch FROM least(j.finished_at, to_timestamp(:end))"
                " - greatest(e.at, to_timestamp(:start)))), 0) FROM jobs j"
                " JOIN LATERAL (SELECT min(at) AS at FROM job_history WHERE job_id = j.id"
                "               AND to_status = 'leased') e ON true"
                " WHERE j.organization_id = :org AND j.finished_at IS NOT NULL"),
                {"org": org, "start": began, "end": began + seconds}).scalar_one()
    total = float(busy["A"] + busy["B"]) or 1.0
    share_a, share_b = float(busy["A"]) / total, float(busy["B"]) / total
    shares_ok = abs(share_a - 2 / 3) <= 0.1 * 2 / 3 and abs(share_b - 1 / 3) <= 0.1 * 1 / 3
    print(f"fairness by time, weights A 2 (2 s jobs), B 1 (50 ms jobs), {slots} slots, "
          f"{seconds:.0f} s: busy-time shares A {share_a:.3f}, B {share_b:.3f}")
    print(f"target 19e shares within 10% of the weights (0.667 / 0.333): "
          f"{verdict(shares_ok)}")

    # B's wait while A floods: B runs nothing; each of its jobs ranks first once a slot frees.
    empty(stack)
    a, a_user = tenant(stack)
    b, b_user = tenant(stack)
    queue(stack, a, a_user, int(seconds * slots), seconds=[2.0] * int(seconds * slots))
    until = time.time() + seconds / 2
    procs = [multiprocessing.Process(target=_slot, args=(stack.worker_url, f"f{i}", until, 1))
             for i in range(slots)]
    for proc in procs:
        proc.start()
    time.sleep(min(3.0, seconds / 8))  # every slot busy with A's jobs
    while time.time() < until - 1:
        queue(stack, b, b_user, 1, seconds=[0.05])
        time.sleep(0.2)
    for proc in procs:
        proc.join()
    with stack.admin() as conn:
        waits = [float(w) for w in conn.execute(text(
            "SELECT extract(epoch FROM (SELECT min(e.at) FROM job_history e WHERE e.job_id = j.id"
            " AND e.to_status = 'leased') - j.created_at) FROM jobs j"
            " WHERE j.organization_id = :org AND j.started_at IS NOT NULL"),
            {"org": b}).scalars()]
    bound = 2.1
    p95 = percentile(waits, 95) if waits else float("inf")
    print(f"  B's wait behind A's flood: p50 {statistics.median(waits) if waits else 0:.3f} s, "
          f"p95 {p95:.3f} s over {len(waits)} jobs (bound: one A job, 2 s, plus a claim)")
    print(f"target 19f B's p95 wait within the bound {bound} s: {p95:.3f} s {verdict(p95 <= bound)}")
    return [shares_ok, p95 <= bound]


def claim_cost(servers: Servers, log_dir: Path, finished: int, rounds: int) -> list[bool]:
    """Three databases on the same server, claimed from in turn so that a busy moment of the
    machine (and the dead row versions each rolled-back claim leaves) falls on all alike."""
    with contextlib.ExitStack() as stacks:
        for name in ("plain", "featured", "behind"):
            (log_dir / name).mkdir(parents=True, exist_ok=True)
        plain, featured, behind = (stacks.enter_context(running_stack(servers, log_dir / name))
                                   for name in ("plain", "featured", "behind"))
        for stack in (plain, featured, behind):
            tenants = [tenant(stack) for _ in range(8)]
            for org, user in tenants:
                queue(stack, org, user, 500)
            if stack is plain:
                continue
            with stack.admin() as conn:
                for org, _ in tenants[4:]:
                    accounts.set_rate_limit(conn, org, OTHER_KIND, RateLimit(100, 60))
            for org, user in tenants[4:]:
                queue(stack, org, user, 200, kind=OTHER_KIND)
                queue(stack, org, user, 200, keys=[f"k{i % 20}" for i in range(200)])
            if stack is behind and finished:
                org, user = tenants[0]
                with stack.admin() as conn:
                    conn.execute(text(
                        "INSERT INTO jobs (organization_id, requested_by, kind, status,"
                        " lease_seconds, max_attempts, attempts, started_at, finished_at,"
                        " sequence_key, sequence_position)"
                        " SELECT :org, :user, :kind, 'completed', 60, 3, 1, now(), now(),"
                        "        'k' || (g % 20), nextval('job_sequence_positions')"
                        " FROM generate_series(1, :n) g"),
                        {"org": org, "user": user, "kind": KIND, "n": finished})
        for stack in (plain, featured, behind):
            with stack.admin() as conn:
                conn.execute(text("ANALYZE jobs"))
        samples: dict[str, list[float]] = {"plain": [], "featured": [], "behind": []}
        for _ in range(rounds):
            for name, stack in (("plain", plain), ("featured", featured), ("behind", behind)):
                with stack.worker_db.connect() as conn, conn.begin() as tx:
                    began = time.perf_counter()
                    store.claim_batch(conn, "cost", limit=10, controls=[])
                    samples[name].append(time.perf_counter() - began)
                    tx.rollback()
    ms = {name: 1000 * statistics.median(values) for name, values in samples.items()}
    ratio, flat = ms["featured"] / ms["plain"], ms["behind"] / ms["featured"]
    print(f"claim of 10 from 8 organizations, median of {rounds} each, interleaved: "
          f"{ms['plain']:.3f} ms plain, {ms['featured']:.3f} ms with rate limits and sequences "
          f"queued ({ratio:.2f}x), {ms['behind']:.3f} ms with them behind {finished:,} finished "
          f"rows ({flat:.2f}x)")
    print(f"target 19g claim with flow control <= 1.2x without: {ratio:.2f}x {verdict(ratio <= 1.2)}")
    print(f"target 19h flat behind {finished:,} finished rows (<= 1.2x): {flat:.2f}x "
          f"{verdict(flat <= 1.2)}")
    return [ratio <= 1.2, flat <= 1.2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.flow_control", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=int, default=10, help="the rate limit's window, s")
    parser.add_argument("--claimers", type=int, default=16)
    parser.add_argument("--slots", type=int, default=8, help="slots of the other parts")
    parser.add_argument("--keys", type=int, default=200, help="sequences' keys")
    parser.add_argument("--per-key", type=int, default=20, help="jobs per key")
    parser.add_argument("--fair-seconds", type=float, default=60)
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=200, help="claims timed per case")
    parser.add_argument("--only", choices=("rate", "sequences", "fairness", "cost"), default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("SPACEJOBS_BENCH_KINDS", "1")
    load_kinds()
    servers = find_or_start()
    results: list[bool] = []
    try:
        servers.migrated_template()
        log_dir = Path(tempfile.mkdtemp(prefix="sj-flow-"))
        (log_dir / "main").mkdir()
        with running_stack(servers, log_dir / "main") as stack:
            parts = {"rate": lambda: rate_limit(stack, args.window, args.claimers),
                     "sequences": lambda: sequences(stack, args.slots, args.keys, args.per_key),
                     "fairness": lambda: fairness(stack, args.fair_seconds, args.slots),
                     "cost": lambda: claim_cost(servers, log_dir, args.finished, args.rounds)}
            for name, part in parts.items():
                if args.only in (None, name):
                    results += part()
    finally:
        servers.close()
    print(json.dumps({"targets": len(results), "pass": sum(results)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
