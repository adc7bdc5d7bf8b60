"""What a stored result is, as its job row records it. Imports nothing of ours, so the kinds,
the runtime context, the store and the web can all use it without a cycle."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: a stored file that a kind made itself (a ZIP...): served as itself
FILE = "file"
#: a JSON result too large to keep inline: the API serves it in the same envelope as an inline
#: one, so a client never sees a different shape because an organization grew
JSON = "json"

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_filename(name: str) -> str:
    """A download name that needs no quoting anywhere: letters, digits, ``.``, ``_``, ``-``."""
    cleaned = _UNSAFE.sub("-", name).strip(".-")[:120]
    return cleaned or "result"


@dataclass(frozen=True)
class StoredResult:
    """A result in the results store. A kind returns the one ``ctx.store_result(...)`` gave it;
    the finish records ``key`` in ``jobs.result_ref`` and :meth:`descriptor` in ``jobs.result``.
    """

    key: str
    content_type: str
    filename: str
    size: int
    form: str = FILE

    def descriptor(self) -> dict[str, Any]:
        return {"stored": {"content_type": self.content_type, "filename": self.filename,
                           "size": self.size, "form": self.form}}

    @classmethod
    def from_row(cls, ref: str, result: Mapping[str, Any]) -> StoredResult:
        stored = result["stored"]
        return cls(key=ref, content_type=stored["content_type"], filename=stored["filename"],
                   size=int(stored["size"]), form=stored.get("form", FILE))
