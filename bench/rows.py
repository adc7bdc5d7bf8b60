"""What a benchmark reads from a Space Jobs stack's rows, by organization: the invariants of a
phase, its latencies, and waiting for its jobs to finish. Shared by bench.hosts (the
throughput harness reads its own through bench.peers.spacejobs).
"""

from __future__ import annotations

import math
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

from models.jobs.records import TERMINAL
from tests.kit import facts
from tests.kit.seeding import Tenant
from tests.kit.stack import Stack

KIND = "bench.noop"


class BenchError(RuntimeError):
    pass


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile: always a value that was actually observed."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def _log(message: str) -> None:
    # Progress goes to stderr so stdout carries only the report.
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def seed_tenant(stack: Stack, label: str) -> Tenant:
    """One organization per phase, so each phase's rows are told apart by organization_id."""
    return stack.tenant(f"bench-{label}")


@dataclass
class PhaseRows:
    total: int
    completed: int
    single_attempt: int
    ordered_times: int
    clean_events: int
    diagnostics: int
    claims_by_actor: dict[str, int]
    first_created: Any
    last_created: Any
    first_started: Any
    last_finished: Any

    def invariants(self, expected: int) -> tuple[bool, str]:
        ok = (self.total == self.completed == self.single_attempt == self.ordered_times
              == self.clean_events == expected and self.diagnostics == 0)
        claims = " / ".join(str(n) for n in self.claims_by_actor.values())
        return ok, (f"{self.completed}/{expected} completed, {self.single_attempt} in 1 attempt, "
                    f"{self.clean_events} with events exactly queued>leased>completed, "
                    f"{self.ordered_times} with created<=started<=finished, "
                    f"{self.diagnostics} diagnostics, claims by {len(self.claims_by_actor)} "
                    f"processes ({claims})")


def count_finished(stack: Stack, org: uuid.UUID) -> int:
    with stack.admin() as conn:
        counts = facts.counts_by_status(conn, org)
    return sum(counts[status] for status in TERMINAL)


def phase_rows(stack: Stack, org: uuid.UUID) -> PhaseRows:
    with stack.admin() as conn:
        row = conn.execute(text(
            "SELECT count(*) AS total,"
            " count(*) FILTER (WHERE status = 'completed') AS completed,"
            " count(*) FILTER (WHERE attempts = 1) AS single_attempt,"
            " count(*) FILTER (WHERE created_at <= started_at AND started_at <= finished_at)"
            "   AS ordered_times,"
            " min(created_at) AS first_created, max(created_at) AS last_created,"
            " min(started_at) AS first_started, max(finished_at) AS last_finished"
            " FROM jobs WHERE organization_id = :org"), {"org": org}).mappings().one()
        clean_events = conn.execute(text(
            "SELECT count(*) FROM (SELECT job_id FROM job_events WHERE organization_id = :org"
            " GROUP BY job_id HAVING array_agg(to_status ORDER BY id)"
            " = ARRAY['queued', 'leased', 'completed']) s"), {"org": org}).scalar_one()
        diagnostics = conn.execute(
            text("SELECT count(*) FROM job_diagnostics WHERE organization_id = :org"),
            {"org": org}).scalar_one()
        claims = dict(conn.execute(text(
            "SELECT actor, count(*) FROM job_events WHERE organization_id = :org"
            " AND to_status = 'leased' GROUP BY actor ORDER BY actor"), {"org": org}).all())
    return PhaseRows(row["total"], row["completed"], row["single_attempt"], row["ordered_times"],
                     clean_events, diagnostics, claims, row["first_created"], row["last_created"],
                     row["first_started"], row["last_finished"])


def latencies(stack: Stack, org: uuid.UUID) -> list[float]:
    with stack.admin() as conn:
        return [float(v) for v in conn.execute(text(
            "SELECT extract(epoch FROM finished_at - created_at) FROM jobs"
            " WHERE organization_id = :org AND status = 'completed'"), {"org": org}).scalars()]


def wait_finished(stack: Stack, org: uuid.UUID, expected: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (done := count_finished(stack, org)) < expected:
        stack.processes.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"only {done}/{expected} jobs finished after {timeout:.0f}s")
        time.sleep(0.2)
