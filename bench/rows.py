"""What the benchmarks read from a Space Jobs database for their figures: the job rows and the
events their triggers wrote (rows.sql), never the workers' reports.

Every reader takes a connection that sees every row (the owner role, as tests/kit's
``Stack.admin``, or a superuser) and, where it makes sense, an organization: given, only its
jobs are read (bench.hosts gives each phase one); None, every job in the database
(bench.throughput's Space Jobs driver empties the tables between figures).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from spacejobs.models.db.queries import queries_beside
from spacejobs.models.jobs.records import TERMINAL
from tests.kit import facts

Q = queries_beside(__file__)


@dataclass(frozen=True)
class Progress:
    """How far a drain has gone: polled while the jobs run."""

    queued: int
    completed: int
    first_started: datetime | None
    last_finished: datetime | None


@dataclass(frozen=True)
class Outcome:
    """What the rows and their events say about a set of jobs once they have run."""

    jobs: int
    completed: int
    single_attempt: int
    completed_once: int  # completed, in one attempt
    ordered_times: int  # created_at <= started_at <= finished_at
    clean_chains: int  # events exactly queued > leased > completed
    diagnostics: int
    first_created: datetime | None
    last_created: datetime | None
    first_started: datetime | None
    last_finished: datetime | None
    first_leased: datetime | None  # events, stamped inside the statement that made the change
    last_completed: datetime | None
    claims_by_actor: dict[str, int]

    def invariants(self, expected: int) -> tuple[bool, str]:
        """Whether each of ``expected`` jobs ran once, by every count; and the counts, in words."""
        ok = (self.jobs == self.completed == self.single_attempt == self.ordered_times
              == self.clean_chains == expected and self.diagnostics == 0)
        claims = " / ".join(str(n) for n in self.claims_by_actor.values())
        return ok, (f"{self.completed}/{expected} completed, {self.single_attempt} in 1 attempt, "
                    f"{self.clean_chains} with events exactly queued>leased>completed, "
                    f"{self.ordered_times} with created<=started<=finished, "
                    f"{self.diagnostics} diagnostics, claims by {len(self.claims_by_actor)} "
                    f"processes ({claims})")


def progress(conn: Connection, org: uuid.UUID | None = None) -> Progress:
    return Progress(**conn.execute(Q["progress"], {"org": org}).mappings().one())


def finished_count(conn: Connection, org: uuid.UUID | None = None) -> int:
    """Jobs in a terminal status (completed, failed or cancelled)."""
    counts = facts.counts_by_status(conn, org)
    return sum(counts[status] for status in TERMINAL)


def outcome(conn: Connection, org: uuid.UUID | None = None) -> Outcome:
    row = conn.execute(Q["outcome"], {"org": org}).mappings().one()
    claims = dict(conn.execute(Q["claims_by_actor"], {"org": org}).all())
    return Outcome(**row, claims_by_actor=claims)


def row_latencies(conn: Connection, org: uuid.UUID | None = None) -> list[float]:
    """Seconds from created_at to finished_at of each completed job."""
    return [float(v) for v in conn.execute(Q["row_latencies"], {"org": org}).scalars()]


def event_latencies(conn: Connection, org: uuid.UUID | None = None) -> list[tuple[float, float]]:
    """(to the completion event, to the lease event), in seconds from created_at, per job that
    has both."""
    return [(float(finished), float(started))
            for finished, started in conn.execute(Q["event_latencies"], {"org": org})]


def leased_count(conn: Connection) -> int:
    return conn.execute(Q["leased_count"]).scalar_one()


def completion_times(conn: Connection) -> dict[Any, datetime]:
    """Each job's completion event time, by job id."""
    return dict(conn.execute(Q["completion_events"]).all())


def lone_wait(conn: Connection, lone: uuid.UUID) -> dict[str, Any]:
    """The fairness figure's facts (rows.sql ``lone_wait``) for the lone organization's job."""
    return dict(conn.execute(Q["lone_wait"], {"lone": lone}).mappings().one())
