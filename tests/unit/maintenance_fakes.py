"""Stand-ins for what a maintenance chore (tasks/maintenance/) runs with and calls: the worker
process (its engine, publisher, results store and settings), a recording transaction, a
publisher that can fail, a results store that can fail a delete. The chores' unit tests replace
the store's statements of the chore's own module with fakes and look at its decisions."""

from __future__ import annotations

import contextlib
import uuid
from types import SimpleNamespace
from typing import Any

from spacejobs.models.settings import get_settings


class FakeResults:
    def __init__(self, failing: frozenset[str] = frozenset()) -> None:
        self.deleted: list[str] = []
        self.failing = failing

    def delete(self, key: str) -> None:
        if key in self.failing:
            raise OSError("store unreachable")
        self.deleted.append(key)


class Publisher:
    """The publisher's ``wake``: records each call; fails every call after ``fail_after``."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.calls: list[tuple[str, bool]] = []
        self.fail_after = fail_after

    def __call__(self, job_id: str, *, force: bool = False) -> bool:
        self.calls.append((job_id, force))
        return self.fail_after is None or len(self.calls) <= self.fail_after


class Transactions:
    """``transaction(engine, actor=...)``: records the actor of each, yields a fake connection."""

    def __init__(self) -> None:
        self.actors: list[str | None] = []

    def __call__(self, engine: Any, *, actor: str | None = None) -> Any:
        self.actors.append(actor)
        return contextlib.nullcontext("conn")


def process(publish: Publisher | None = None, results: FakeResults | None = None,
            **extra: Any) -> SimpleNamespace:
    """The worker process a chore runs as."""
    found = results or FakeResults()
    return SimpleNamespace(engine="engine", publisher=SimpleNamespace(wake=publish or Publisher()),
                           results=lambda: found, settings=get_settings(), **extra)


def ids(n: int) -> list[uuid.UUID]:
    return [uuid.uuid4() for _ in range(n)]

