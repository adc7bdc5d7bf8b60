"""The operators' list of jobs, a workflow's (or a fan-out's) steps grouped under it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class JobGroup:
    job: Mapping[str, Any]
    #: its steps among the listed jobs, in their order
    steps: list[Mapping[str, Any]] = field(default_factory=list)


def grouped_by_parent(rows: Iterable[Mapping[str, Any]]) -> list[JobGroup]:
    """The listed jobs in their order (newest first), each step placed under its parent when
    the parent is listed too; a step whose parent is not (filtered out, or older than the
    page) stays on a line of its own, which names its parent."""
    listed = list(rows)
    parent_of = {row["id"]: row.get("parent_id") for row in listed}

    def outermost(job_id: Any) -> Any:
        seen = {job_id}
        while parent_of.get(job_id) in parent_of and parent_of[job_id] not in seen:
            job_id = parent_of[job_id]
            seen.add(job_id)
        return job_id

    groups: dict[Any, JobGroup] = {}
    for row in listed:
        top = outermost(row["id"])
        if top == row["id"]:
            groups.setdefault(top, JobGroup(row)).job = row
        else:
            groups.setdefault(top, JobGroup(next(r for r in listed if r["id"] == top))).steps.append(row)
    for group in groups.values():
        group.steps.sort(key=lambda step: (step.get("child_index") is None,
                                           step.get("child_index") or 0, str(step["created_at"])))
    return [groups[row["id"]] for row in listed if row["id"] in groups]
