"""The evidence about workflows, fan-outs and waiting jobs: read from the rows, job_events,
job_steps and job_signals (``composites.sql``) once every job is terminal, and sampled while the
run goes for jobs left waiting with their condition met. Each figure is a count the invariants
judge, with a few job ids as examples (ids only: no params, results or payloads in the report).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from bench.chaos.client import ClientTally
from bench.chaos.kinds import DRAW_STEP
from bench.chaos.mix import PARENT_KINDS, Shape
from spacejobs.models.db.queries import queries_beside
from spacejobs.models.jobs.records import ACTIVE, TERMINAL, Status

Q = queries_beside(__file__)
# A waiting job's timer may be this late before the watch calls it stuck: beat's timers chore
# resumes due timers every SPACEJOBS_TIMER_INTERVAL (and its waits chore every
# SPACEJOBS_SWEEP_INTERVAL, 1 s in a chaos run), and not while PostgreSQL is down (3 s) or until
# the next run after it (a few seconds).
TIMER_SLACK_SECONDS = 10.0
EXAMPLES = 3


@dataclass
class CompositeFindings:
    """Counts from the rows; ``examples`` holds a few job ids per finding that must be 0."""

    parents: Counter[str] = field(default_factory=Counter)  # terminal status -> workflows + fan-outs
    parents_by_shape: Counter[str] = field(default_factory=Counter)
    parents_not_terminal: int = 0
    parents_terminal_events_off: int = 0  # terminal, but not exactly one terminal event
    parents_with_active_steps: int = 0
    steps: Counter[str] = field(default_factory=Counter)  # child status -> children
    places_with_two_children: int = 0
    children_completed_twice: int = 0
    completed_parents_missing_steps: int = 0  # a place without exactly one completed child
    results_not_the_steps: int = 0  # a completed parent's result is not its children's
    draws_not_recorded_once: int = 0  # chaos.fan's result draw is not its job_steps draw
    cancelled_parents: int = 0
    started_after_cancel: list[tuple[str, str, float]] = field(default_factory=list)
    steps_cancelled_alone: int = 0
    timers_completed: int = 0
    timers_early: int = 0
    signal_jobs: Counter[str] = field(default_factory=Counter)  # status -> await_signal jobs
    signals_before_wait: int = 0
    signals_after_wait: int = 0
    signals_taken_wrong: int = 0  # a completed job that did not take its one signal, or twice
    signal_results_wrong: int = 0  # a completed job whose result is not the payload it was sent
    waits_met_readings: int = 0
    waits_met_seen: int = 0  # the most stuck waiting jobs in any one reading
    waits_met_at_end: int = 0
    examples: dict[str, list[str]] = field(default_factory=dict)

    def note(self, finding: str, job_id: str) -> None:
        kept = self.examples.setdefault(finding, [])
        if len(kept) < EXAMPLES:
            kept.append(job_id)


def waits_met(conn: Connection) -> list[tuple[str, str, str]]:
    """(job id, kind, what has come) of each waiting job whose condition has come."""
    return [(row.id, row.kind, row.met)
            for row in conn.execute(Q["waits_met"], {"slack": TIMER_SLACK_SECONDS})]


class WaitWatch(threading.Thread):
    """Every ``every`` seconds while the run goes, the waiting jobs whose condition has come,
    read as the owner; readings that meet PostgreSQL restarting are skipped."""

    def __init__(self, owner: Callable[[], AbstractContextManager[Connection]], findings: CompositeFindings,
                 every: float = 2.0) -> None:
        super().__init__(name="chaos-wait-watch", daemon=True)
        self.owner = owner
        self.findings = findings
        self.every = every
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            try:
                with self.owner() as conn:
                    stuck = waits_met(conn)
            except DBAPIError:
                continue
            self.findings.waits_met_readings += 1
            self.findings.waits_met_seen = max(self.findings.waits_met_seen, len(stuck))
            for job_id, kind, met in stuck:
                self.findings.note(f"waiting with {met} ({kind})", job_id)


def read_composites(findings: CompositeFindings, conn: Connection, tally: ClientTally) -> None:
    """Fill in the findings from the rows, once every job is terminal (as the owner)."""
    stuck = waits_met(conn)
    findings.waits_met_at_end = len(stuck)
    for job_id, kind, met in stuck:
        findings.note(f"waiting with {met} ({kind}) at the end", job_id)
    children: dict[str, dict[int, list[Any]]] = {}
    for row in conn.execute(Q["children"]):
        children.setdefault(row.parent_id, {}).setdefault(row.child_index, []).append(row)
    draws = {row.id: row.result for row in conn.execute(Q["draws"], {"name": DRAW_STEP})}
    for parent in conn.execute(Q["parents"], {"kinds": list(PARENT_KINDS)}):
        if parent.id in tally.accepted:
            _judge_parent(findings, parent, children.get(parent.id, {}), draws, tally)
    for row in conn.execute(Q["started_after_cancel"]):
        findings.started_after_cancel.append((row.parent_id, row.event, float(row.seconds_after)))
        findings.note("step started after its workflow's cancel", row.id)
    findings.steps_cancelled_alone = conn.execute(Q["steps_cancelled_alone"]).scalar_one()
    _judge_timers(findings, conn)
    _judge_signals(findings, conn, tally)


def _judge_parent(findings: CompositeFindings, parent: Any, places: dict[int, list[Any]],
                  draws: dict[str, Any], tally: ClientTally) -> None:
    status = Status(parent.status)
    findings.parents[status] += 1
    findings.parents_by_shape[tally.shape_of.get(parent.id, Shape.PLAIN)] += 1
    findings.cancelled_parents += parent.cancelled_at is not None
    if status not in TERMINAL:
        findings.parents_not_terminal += 1
        findings.note("workflow not terminal", parent.id)
    elif parent.terminal_events != 1:
        findings.parents_terminal_events_off += 1
        findings.note("workflow with other than one terminal event", parent.id)
    rows = [row for place in places.values() for row in place]
    for row in rows:
        findings.steps[row.status] += 1
        if row.completions > 1:
            findings.children_completed_twice += 1
            findings.note("step completed twice", row.id)
    if any(Status(row.status) in ACTIVE for row in rows):
        findings.parents_with_active_steps += 1
        findings.note("workflow with a step still active", parent.id)
    if any(len(place) > 1 for place in places.values()):
        findings.places_with_two_children += 1
        findings.note("workflow with two children in one place", parent.id)
    if status is not Status.COMPLETED:
        return
    expected = _step_count(parent)
    done = {index: place[0] for index, place in places.items()
            if len(place) == 1 and place[0].status == Status.COMPLETED}
    if sorted(done) != list(range(expected)) or len(places) != expected:
        findings.completed_parents_missing_steps += 1
        findings.note("completed workflow without one completed step per place", parent.id)
        return
    if _collected(parent) != [done[index].result for index in range(expected)]:
        findings.results_not_the_steps += 1
        findings.note("completed workflow whose result is not its steps' results", parent.id)
    if parent.kind == "chaos.fan" and (parent.id not in draws
                                       or draws[parent.id] != (parent.result or {}).get("draw")):
        findings.draws_not_recorded_once += 1
        findings.note("fan-out whose result's draw is not its recorded step", parent.id)


def _step_count(parent: Any) -> int:
    params = parent.params or {}
    return len(params["steps"]) if parent.kind == "workflow" else len(params["seconds"])


def _collected(parent: Any) -> list[Any]:
    """The children's results as the completed parent returned them, in place order."""
    result = parent.result or {}
    if parent.kind == "workflow":
        names = [step["name"] for step in parent.params["steps"]]
        return [result.get("steps", {}).get(name) for name in names]
    return list(result.get("children", []))


def _judge_timers(findings: CompositeFindings, conn: Connection) -> None:
    for row in conn.execute(Q["timers"]):
        findings.timers_completed += 1
        if row.completed_at < row.due:
            findings.timers_early += 1
            findings.note("timer completed before its moment", row.id)


def _judge_signals(findings: CompositeFindings, conn: Connection, tally: ClientTally) -> None:
    for row in conn.execute(Q["signals"]):
        findings.signal_jobs[row.status] += 1
        if row.sent_at is not None:
            if row.first_waited_at is None or row.sent_at < row.first_waited_at:
                findings.signals_before_wait += 1
            else:
                findings.signals_after_wait += 1
        if row.taken > 1:  # each wait takes one signal, and these jobs wait once
            findings.signals_taken_wrong += 1
            findings.note("signal job that took more than one signal", row.id)
        if row.status != Status.COMPLETED:
            continue
        if row.taken != 1:
            findings.signals_taken_wrong += 1
            findings.note("completed signal job that did not take one signal", row.id)
        payload = tally.signal_payload_of.get(row.id)
        if payload is None or (row.result or {}).get("payload") != payload:
            findings.signal_results_wrong += 1
            findings.note("completed signal job whose result is not the payload sent", row.id)


def example_lines(findings: CompositeFindings) -> Iterable[str]:
    for finding, ids in findings.examples.items():
        yield f"{finding}: {', '.join(ids)}"
