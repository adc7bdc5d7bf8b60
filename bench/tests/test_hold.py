"""Smoke runs of ``python -m bench.hold`` and ``python -m bench.cost``, tiny, each on the private
PostgreSQL 15 it starts (Redis: the session's): every row is printed with its figures measured,
and every target gets a verdict. Which verdict is not judged here: on a shared machine a tiny
run's figures mean nothing; the benchmark's report is where they are read. PgQueuer is the
optional ``bench`` extra: without it, its rows are left out and the report says so."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from tests.kit.processes import REPO_ROOT
from tests.kit.servers import Servers

pytestmark = pytest.mark.slow  # a benchmark's smoke run

HAVE_PGQUEUER = importlib.util.find_spec("pgqueuer") is not None
VERDICT = r"(PASS|FALL SHORT)"
HOLD_ROW = re.compile(r"^(?P<system>Space Jobs|PgQueuer [\d.]+) +(?P<index>\d) +(?P<phase>before|HOLD|after)"
                      r" +(?P<submitted>[\d,]+) +[\d.]+ / +(?P<claim95>[\d.]+) +[\d.]+ / +(?P<e2e95>[\d.]+)"
                      r" +(?P<finished>[\d,]+) +[\d,]+ +[\d.]+$", re.MULTILINE)


def run(servers: Servers, *args: str) -> str:
    env = dict(os.environ, REDIS_URL=servers.redis_url, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-m", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    return done.stdout


def test_hold_prints_each_systems_minutes_and_every_verdict(servers: Servers) -> None:
    out = run(servers, "bench.hold", "--before", "1", "--hold", "1", "--after", "1",
              "--minute-seconds", "4", "--rate", "50", "--probe-rate", "10")
    rows = [m.groupdict() for m in HOLD_ROW.finditer(out)]
    systems = ["Space Jobs"] + (["PgQueuer"] if HAVE_PGQUEUER else [])
    assert [(r["system"].split()[0], r["index"], r["phase"]) for r in rows] == [
        (system.split()[0], index, phase) for system in systems
        for index, phase in (("1", "before"), ("2", "HOLD"), ("3", "after"))], out
    # 50 jobs/s for 4 s a minute, the first batch of the next minute's schedule aside; the
    # jobs ran and were read back from the rows
    assert all(180 <= int(r["submitted"].replace(",", "")) <= 220 for r in rows), out
    assert all(int(r["finished"].replace(",", "")) > 0 for r in rows), out
    for figure in ("claim p95", "end-to-end p95"):
        for where in ("in the hold's last minute <= 1.5x", "in the first minute after the hold <= 1.2x"):
            peer = rf"; beside it PgQueuer [\d.]+ [\d.]+x \(.*\) \[{VERDICT}\]" if HAVE_PGQUEUER else ""
            assert re.search(rf"^target {figure} {where} the minute before the hold: Space Jobs"
                             rf" [\d.]+x \([\d.]+ vs [\d.]+ ms\) {VERDICT}{peer}$", out, re.MULTILINE), out
    if not HAVE_PGQUEUER:
        assert "PgQueuer  : not measured" in out, out


def test_cost_prints_each_systems_life_and_every_verdict(servers: Servers) -> None:
    out = run(servers, "bench.cost", "--jobs", "60", "--settle", "0", "--only", "spacejobs",
              "--only", "pgqueuer", "--only", "floor")
    lives = ["Space Jobs, single submits", "Space Jobs, bulk of 1000"] + (
        ["PgQueuer [\\d.]+, single submits", "PgQueuer [\\d.]+, bulk of 1000"] if HAVE_PGQUEUER else [])
    for life in lives:
        # enqueue and whole-life WAL, rows written, drain rate, commits and growth per job
        assert re.search(rf"^{life} +[\d,]+ +[\d,]+ +[\d.]+ +[\d,]+ +[\d.]+ +-?[\d,]+$", out,
                         re.MULTILINE), out
    assert re.search(r"^pgbench INSERT floor \(one row a commit\) +[\d,]+$", out, re.MULTILINE), out
    # pg_walinspect names the relations Space Jobs' enqueue writes: its job row among them
    assert re.search(r"^WAL by relation, Space Jobs' single enqueue, per job: .*\bjobs [\d,]+ B",
                     out, re.MULTILINE), out
    # and the relations its jobs grew, the job rows' table among them
    assert re.search(r"^growth by relation, Space Jobs, single, per 1,000 jobs: .*\bjobs -?[\d,]+ KB",
                     out, re.MULTILINE), out
    assert re.search(rf"^target whole-life WAL per job, single submits <= 2,560 B: [\d,]+ B {VERDICT}$",
                     out, re.MULTILINE), out
    compared = [r"whole-life WAL per job, single submits", r"rows written per job",
                r"table \+ index growth per 1,000 finished jobs"]
    for what in compared:
        tail = rf"vs [-\d.,]+( KB| B)? {VERDICT}" if HAVE_PGQUEUER else "PgQueuer not measured"
        assert re.search(rf"^target {what} <= PgQueuer's: [-\d.,]+ .*{tail}$", out, re.MULTILINE), out
    if HAVE_PGQUEUER:
        assert re.search(rf"^target drain >= 1.1x PgQueuer's: [\d.]+x .* {VERDICT}$", out, re.MULTILINE), out
    assert re.search(rf"^target commits per job in the drain <= 0.02 \(to two decimals\): [\d.]+"
                     rf" {VERDICT}$", out, re.MULTILINE), out
