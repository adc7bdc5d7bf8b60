"""The literal status lists of SQL text, and which of them drift from the sets of
models/jobs/records.py.

A list that holds the active core (queued, leased, cancel_requested) and nothing but active
statuses means "active": it must be ACTIVE. A list of terminal statuses that holds completed
means "ended": it must be TERMINAL. A list of every status (the column's CHECK) must be every
status. Other lists (a transition's targets, what a cancel moves, the failures) name smaller
sets of their own and are left alone; so is a list that names an unknown status, which is
reported as such.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from spacejobs.models.jobs.records import ACTIVE, ALL_STATUSES, TERMINAL, Status

# status IN ('queued', 'leased') as written; ARRAY['queued'::text, ...] as PostgreSQL deparses an
# index predicate or a constraint
_LIST = re.compile(r"(?:\bIN\s*\(|ARRAY\[)\s*('[a-z_]+'(?:::text)?(?:\s*,\s*'[a-z_]+'(?:::text)?)*)"
                   r"\s*[)\]]", re.IGNORECASE)
_VALUES = frozenset(s.value for s in Status)
_ACTIVE_CORE = frozenset({Status.QUEUED, Status.LEASED, Status.CANCEL_REQUESTED})


@dataclass(frozen=True)
class Drift:
    where: str
    written: tuple[str, ...]
    meant: str

    def __str__(self) -> str:
        return f"{self.where}: ({', '.join(self.written)}) should be {self.meant}"


def status_lists(sql: str) -> list[tuple[str, ...]]:
    """Every literal list in ``sql`` whose items all look like statuses (lowercase words)."""
    found = []
    for match in _LIST.finditer(sql):
        items = tuple(item.strip().removesuffix("::text").strip("'")
                      for item in match[1].split(","))
        if any(item in _VALUES for item in items):
            found.append(items)
    return found


def drifts(where: str, sql: str) -> tuple[int, list[Drift]]:
    """How many lists of ``sql`` mean one of the defined sets, and those that differ from it."""
    meant_lists, found = 0, []
    for items in status_lists(sql):
        written = frozenset(items)
        if not written <= _VALUES:
            found.append(Drift(where, items, "known statuses only"))
            continue
        statuses = frozenset(Status(item) for item in written)
        if statuses >= _ACTIVE_CORE and statuses <= ACTIVE | _ACTIVE_CORE and not statuses & TERMINAL:
            meant, name = ACTIVE, "ACTIVE"
        elif Status.COMPLETED in statuses and statuses <= TERMINAL | {Status.COMPLETED}:
            meant, name = TERMINAL, "TERMINAL"
        elif statuses >= ACTIVE and statuses >= TERMINAL:
            meant, name = frozenset(ALL_STATUSES), "every status"
        else:
            continue
        meant_lists += 1
        if statuses != meant or len(items) != len(written):
            found.append(Drift(where, items, f"{name} {sorted(s.value for s in meant)}"))
    return meant_lists, found
