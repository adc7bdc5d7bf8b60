"""Is this host's worker alive and working? The answer of ``spacejobs worker check`` and of the
worker's HTTP probe, for an orchestrator's liveness check (Kubernetes, compose).

A worker can be alive and useless: Celery's consumer wedged after a broker reconnect, a pool
process hung in a job that ignores its limits, a database it can no longer reach. From its own
host, with the worker role, the check reads the presence rows of the host's live processes
(pids alive here) and fails when:

- none has registered (the worker is not running, or cannot reach PostgreSQL);
- one has not heartbeated for ``stale`` seconds (its presence thread, or the process, is stuck);
- jobs of the kinds they serve have been due for ``due_after`` seconds while every one of them
  is idle (running nothing), and still is a heartbeat later having finished nothing meanwhile:
  they are alive but not claiming. (A heartbeat's ``running`` is a moment's count, and a process
  draining a backlog of short jobs is often between two of them; the second look tells the
  two apart.) Paused and limited kinds are left out, as their jobs may wait on purpose.

Nothing here is tenant data: process ids, kinds' counts and ages only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Connection

from spacejobs.models.db.queries import queries_beside
from spacejobs.models.settings import Settings

Q = queries_beside(__file__)


@dataclass(frozen=True)
class Process:
    id: str
    pid: int
    kinds: list[str]
    running: int
    processed: int  # jobs it has finished since it started
    silent_for: float  # seconds since its last heartbeat


@dataclass(frozen=True)
class Verdict:
    processes: list[Process]
    #: how long the longest-due job of their kinds has been due (None: none is)
    oldest_due: float | None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        if not self.ok:
            return "FAIL: " + "; ".join(self.problems)
        heartbeats = ", ".join(f"{p.silent_for:.1f}" for p in self.processes)
        due = "none due" if self.oldest_due is None else f"oldest due {self.oldest_due:.1f} s"
        return (f"ok: {len(self.processes)} worker process(es) on this host, heartbeats {heartbeats}"
                f" s ago, {sum(p.running for p in self.processes)} job(s) running, {due}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


#: seconds a job may be due beside idle processes before the check fails
DUE_AFTER = 60.0


def check_host(conn: Connection, hostname: str, settings: Settings, *, stale: float | None = None,
               due_after: float = DUE_AFTER) -> Verdict:
    """:func:`check` with the settings' clock: stale after 3 presence intervals (unless
    ``stale``), the second look after the next heartbeat."""
    return check(conn, hostname,
                 stale=stale if stale is not None else 3 * settings.presence_interval,
                 due_after=due_after,
                 look_again=lambda: time.sleep(settings.presence_interval + 1))


def check(conn: Connection, hostname: str, *, stale: float, due_after: float,
          look_again: Callable[[], None], alive: Callable[[int], bool] = pid_alive) -> Verdict:
    """The verdict for ``hostname``'s worker processes (see the module's doc). ``look_again``
    waits for the next heartbeat (the second look); it is called only when the first look finds
    jobs due beside idle processes."""
    processes = _live(conn, hostname, alive)
    if not processes:
        return Verdict([], None, [f"no live worker process of {hostname} has registered"])
    problems = [f"process {p.id} has not heartbeated for {p.silent_for:.0f} s"
                for p in processes if p.silent_for > stale]
    kinds = sorted({kind for p in processes for kind in p.kinds})
    oldest_due = conn.execute(Q["oldest_due"], {"kinds": kinds}).scalar_one()
    if oldest_due is not None and oldest_due > due_after and not any(p.running for p in processes):
        conn.commit()  # the second look reads the heartbeats written meanwhile
        look_again()
        again = {p.id: p for p in _live(conn, hostname, alive)}
        stuck = all(p.id in again and again[p.id].running == 0
                    and again[p.id].processed == p.processed for p in processes)
        if stuck:
            problems.append(f"jobs have been due for {oldest_due:.0f} s while every process of"
                            " this host runs nothing and has finished nothing since")
    return Verdict(processes, oldest_due, problems)


def _live(conn: Connection, hostname: str, alive: Callable[[int], bool]) -> list[Process]:
    rows = conn.execute(Q["processes_on"], {"host": hostname})
    return [process for process in (Process(row.id, row.pid, list(row.kinds), row.running,
                                            row.processed, row.silent_for) for row in rows)
            if alive(process.pid)]
