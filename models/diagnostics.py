"""What operators and logs may learn of an exception: the classes of its chain, a database
error's SQLSTATE and condition name, and where each was raised (file, line, function, source
line). Never a message, a note or a local variable.

A message can hold anything the code was handling: PostgreSQL quotes the value it refused
(``invalid input syntax for type uuid: "<a member's text>"``, a JSON document up to the bad
character), SQLAlchemy adds the statement, and a kind's own exception may say what it likes.
The class, the SQLSTATE and the frames say what failed and where without carrying any of it.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass

import psycopg.errors

#: how many exceptions of a chain are described (a longer chain is cut, a cycle stops)
MAX_CHAIN = 16

_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"
_SQLSTATE = re.compile(r"[0-9A-Z]{5}")


@dataclass(frozen=True)
class Diagnosis:
    """An exception as operators may see it."""

    #: the outermost exception's class, ``module.qualname``
    exception_class: str
    #: one line for a log: the outermost class and the chain's first SQLSTATE
    summary: str
    #: the chain, oldest first, as Python prints it but with each message left out
    traceback: str


def diagnose(exc: BaseException) -> Diagnosis:
    chain = _chain(exc)
    code = next((found for link, _ in chain if (found := sqlstate(link))), None)
    summary = class_name(exc) + (f" ({_sqlstate_text(code)})" if code else "")
    return Diagnosis(class_name(exc), summary, _render(chain))


def class_name(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a psycopg error, or of the one SQLAlchemy wraps (``.orig``)."""
    for candidate in (exc, getattr(exc, "orig", None)):
        code = getattr(candidate, "sqlstate", None)
        if isinstance(code, str) and _SQLSTATE.fullmatch(code):
            return code
    return None


def condition_name(code: str) -> str | None:
    """PostgreSQL's name for a SQLSTATE (``22P02`` → ``invalid_text_representation``), from
    psycopg's class for it: its CamelCase name is the condition's, checked by looking it up."""
    try:
        found = psycopg.errors.lookup(code)
    except KeyError:
        return None
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", found.__name__).lower()
    try:
        return name if psycopg.errors.lookup(name.upper()) is found else None
    except KeyError:
        return None


def _sqlstate_text(code: str) -> str:
    name = condition_name(code)
    return f"SQLSTATE {code}" + (f" {name}" if name else "")


def _chain(exc: BaseException) -> list[tuple[BaseException, str]]:
    """The chain from the oldest exception to ``exc``, each with the sentence that leads from
    it to the next one (a ``__cause__``, else an unsuppressed ``__context__``), as Python
    prints it."""
    links: list[tuple[BaseException, str]] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    joint = ""
    while current is not None and id(current) not in seen and len(links) < MAX_CHAIN:
        seen.add(id(current))
        links.append((current, joint))
        if current.__cause__ is not None:
            current, joint = current.__cause__, _CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            current, joint = current.__context__, _CONTEXT
        else:
            current = None
    return links[::-1]


def _render(chain: list[tuple[BaseException, str]]) -> str:
    parts = []
    for exc, joint in chain:
        frames = traceback.extract_tb(exc.__traceback__)  # frames only: no locals captured
        if frames:
            parts.append("Traceback (most recent call last):\n")
            parts.extend(frames.format())
        code = sqlstate(exc)
        parts.append(class_name(exc) + (f" [{_sqlstate_text(code)}]" if code else "")
                     + " (message withheld)\n")
        if isinstance(exc, BaseExceptionGroup):
            parts.append("  with " + ", ".join(class_name(e) for e in exc.exceptions) + "\n")
        parts.append(joint)
    return "".join(parts)
