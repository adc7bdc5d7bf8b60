"""The overview's table of kinds: one compact row per kind, sorted by activity, the idle and
the child-only kinds folded away (pure logic, no Flask: tested through plain values)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: the columns the table sorts by, each largest first but ``kind`` (A to Z)
SORTS = ("activity", "queued", "running", "waiting", "oldest", "failed", "p95", "kind")
ACTIVITY_COUNTS = ("queued", "running", "waiting", "completed_1h", "failed_1h", "cancelled_1h")


@dataclass
class KindRow:
    kind: str
    stats: dict[str, Any]
    paused: bool = False
    concurrency_limit: int | None = None
    child_only: bool = False
    per_minute: list[dict[str, Any]] = field(default_factory=list)

    def count(self, name: str) -> int:
        return int(self.stats.get(name) or 0)

    @property
    def running(self) -> int:
        return self.count("leased") + self.count("cancel_requested")

    @property
    def activity(self) -> int:
        """Jobs queued, running or waiting now, and finished in the last hour."""
        return self.running + sum(self.count(name) for name in ACTIVITY_COUNTS if name != "running")

    @property
    def idle(self) -> bool:
        return self.activity == 0

    def sort_key(self, sort: str) -> tuple[float, str]:
        value = {"activity": self.activity, "queued": self.count("queued"), "running": self.running,
                 "waiting": self.count("waiting"), "failed": self.count("failed_1h"),
                 "oldest": self.stats.get("oldest_queued_seconds") or 0.0,
                 "p95": self.stats.get("duration_p95") or 0.0}.get(sort, 0)
        return (-float(value), self.kind)


@dataclass
class KindTable:
    sort: str
    active: list[KindRow]
    child_only: list[KindRow]
    idle: list[KindRow]

    def totals(self, rows: Iterable[KindRow]) -> dict[str, int]:
        listed = list(rows)
        return {"running": sum(r.running for r in listed),
                "queued": sum(r.count("queued") for r in listed),
                "waiting": sum(r.count("waiting") for r in listed)}


def kind_table(known: Iterable[str], child_only: Iterable[str], stats: Iterable[Mapping[str, Any]],
               controls: Mapping[str, Mapping[str, Any]], sort: str = "activity") -> KindTable:
    """Every kind the web knows or the jobs table holds: the active ones (not child-only, with
    jobs now or in the last hour) in the order asked for, then the child-only kinds (steps,
    their activity counted again in their parents' workflows) and the idle kinds, each A to Z."""
    sort = sort if sort in SORTS else "activity"
    by_kind = {row["kind"]: dict(row) for row in stats}
    steps = set(child_only)
    rows = []
    for name in sorted(set(known) | set(by_kind)):
        found = by_kind.get(name, {})
        control = controls.get(name, {})
        rows.append(KindRow(name, found, paused=bool(control.get("paused")),
                            concurrency_limit=control.get("concurrency_limit"),
                            child_only=name in steps, per_minute=list(found.get("per_minute") or [])))
    active = sorted((r for r in rows if not r.child_only and not r.idle),
                    key=lambda r: r.sort_key(sort) if sort != "kind" else (0.0, r.kind))
    return KindTable(sort, active, [r for r in rows if r.child_only],
                     [r for r in rows if not r.child_only and r.idle])


def per_minute_totals(rows: Iterable[KindRow]) -> list[dict[str, Any]]:
    """The kinds' finished jobs per minute added up, for the overview's one chart."""
    minutes: dict[Any, dict[str, Any]] = {}
    for row in rows:
        for point in row.per_minute:
            slot = minutes.setdefault(point["minute"], {"minute": point["minute"],
                                                        "completed": 0, "failed": 0})
            slot["completed"] += point["completed"]
            slot["failed"] += point["failed"]
    return [minutes[m] for m in sorted(minutes)]
