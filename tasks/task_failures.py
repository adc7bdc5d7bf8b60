"""A task's failure as Celery reports it, without the exception's text.

Celery logs a task's exception as ``raised unexpected: <its repr>`` and sends its full
traceback in task-failed events (Flower, ``celery events``). A database error's repr quotes the
values PostgreSQL refused: a result's JSON up to the character jsonb cannot hold, a member's
text taken for a uuid. So a task's exception is logged here as models.logs formats it (classes,
SQLSTATEs, frames) and Celery is handed :class:`TaskFailed`, which says only that much.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from spacejobs.models.diagnostics import diagnose

log = logging.getLogger("spacejobs.tasks")

P = ParamSpec("P")
R = TypeVar("R")


class TaskFailed(Exception):
    """A task's exception, reduced to its class and SQLSTATE (the chain is left behind)."""


def reported_without_messages(task: Callable[P, R]) -> Callable[P, R]:
    """Wrap a task's function: an exception out of it is logged safely and re-raised as
    :class:`TaskFailed`, so Celery still counts the task as failed."""

    @functools.wraps(task)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return task(*args, **kwargs)
        except Exception as exc:
            summary = diagnose(exc).summary
            log.error("task %s failed: %s", task.__name__, summary, exc_info=exc)
            # from None: Celery's own traceback (and its events) must not reach the original.
            raise TaskFailed(summary) from None

    return run
