"""Named SQL blocks, kept in a ``.sql`` file beside the module that runs them.

A block starts with a ``-- name --`` line and runs to the next one, so the statements that
matter are reviewed as SQL (with their comments and the indexes they need), not as strings
scattered through Python. A status set is named, never written out: ``status IN {ACTIVE}``
(also ``{RUNNING}``, ``{TERMINAL}``) becomes the literal list of models/jobs/records.py, where
each set is defined once; a literal, not a parameter, so a partial index on it still serves.
"""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy import TextClause, text

from spacejobs.models.jobs.records import ACTIVE, RUNNING, TERMINAL, sql_list

_HEADER = re.compile(r"--\s*([a-z_]+)\s*--\s*")
_STATUS_SETS = {"ACTIVE": sql_list(ACTIVE), "RUNNING": sql_list(RUNNING),
                "TERMINAL": sql_list(TERMINAL)}
_STATUS_SET = re.compile(r"\{(" + "|".join(_STATUS_SETS) + r")\}")


def parse_blocks(source: str) -> dict[str, str]:
    """``{name: sql}`` for every ``-- name --`` block in ``source``."""
    blocks: dict[str, str] = {}
    name = None
    for line in source.splitlines():
        header = _HEADER.fullmatch(line)
        if header:
            name = header.group(1)
            if name in blocks:
                raise ValueError(f"query {name!r} is defined twice")
            blocks[name] = ""
        elif name is not None:
            blocks[name] += line + "\n"
    return {key: _STATUS_SET.sub(lambda m: _STATUS_SETS[m[1]], value.strip())
            for key, value in blocks.items()}


def queries_beside(module_file: str) -> dict[str, TextClause]:
    """The blocks of the ``.sql`` file named like ``module_file`` (``store.py`` → ``store.sql``)."""
    path = Path(module_file).with_suffix(".sql")
    return {name: text(sql) for name, sql in parse_blocks(path.read_text()).items()}
