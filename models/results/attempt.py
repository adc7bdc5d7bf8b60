"""One attempt's results: the files it wrote to the store, and how its return value is kept.

A file is written BEFORE the fenced finish that records it, so every way an attempt can end
without that finish must take its files back: the kind raised, it stored a file it did not
return, or (in the runner) its finish was stale or refused. A file left behind anyway (a worker
killed between the write and the commit) is the orphan sweep's (models.results.sweep).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from spacejobs.models.errors import ResultNotStorable
from spacejobs.models.jobs.records import LeasedJob
from spacejobs.models.json_limits import check_written
from spacejobs.models.results.records import FILE, JSON, StoredResult, safe_filename
from spacejobs.models.results.store import ResultStore, Source, new_key

log = logging.getLogger("spacejobs.results")

DEFAULT_INLINE_MAX_BYTES = 256 * 1024

#: a NUL in json.dumps' output: ``\u0000`` whose backslash is not itself escaped (an odd run of
#: backslashes); ``\\u0000`` is the text "\u0000", which jsonb keeps
_ESCAPED_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def encode_result(value: Any) -> bytes:
    """A result as the finish stores it, or ResultNotStorable for one jsonb refuses (a NUL in a
    string, NaN, an infinity) or that nests past the depth limit (models/json_limits.py: every
    reader of it, a later step, the web, ``Jobs.wait``, reads it then): refused here, it fails
    its own job, instead of the batched finish that would carry it and every other job
    finishing beside it, whatever their organization."""
    check_written(value, "The job's result")  # first: the encoder below recurses
    try:
        encoded = json.dumps(value, allow_nan=False).encode()
    except ValueError:  # NaN or an infinity (a value JSON cannot hold at all raises TypeError)
        raise ResultNotStorable() from None
    if _ESCAPED_NUL.search(encoded):
        raise ResultNotStorable()
    return encoded


class NoResultStore(RuntimeError):
    """A kind stored a file, or returned a result too large to keep inline, where no store is
    configured."""


class AttemptResults:
    def __init__(self, store: ResultStore | None, job: LeasedJob, *,
                 inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES) -> None:
        self.store = store
        self.job = job
        self.inline_max_bytes = inline_max_bytes
        self.written: list[StoredResult] = []

    def put(self, source: Source, *, content_type: str, filename: str,
            form: str = FILE) -> StoredResult:
        if self.store is None:
            raise NoResultStore("this worker has no results store")
        key = new_key(self.job.organization_id, self.job.id)
        size = self.store.put(key, source, content_type=content_type)
        stored = StoredResult(key, content_type, safe_filename(filename), size, form)
        self.written.append(stored)
        return stored

    def settle(self, value: Any) -> tuple[Any, str | None]:
        """What the finish records: ``(jobs.result, jobs.result_ref)``. A file the kind stored
        is referenced; a JSON result over the threshold goes to the store; anything else stays
        inline. Files written but not returned are deleted here."""
        if isinstance(value, StoredResult):
            if value not in self.written:
                raise ValueError("a job may only return a result it stored itself")
            self.discard(keep=value.key)
            return value.descriptor(), value.key
        encoded = encode_result(value)
        if len(encoded) > self.inline_max_bytes:
            stored = self.put(encoded, content_type="application/json",
                              filename=f"{self.job.kind}-{self.job.id}.json", form=JSON)
            self.discard(keep=stored.key)
            return stored.descriptor(), stored.key
        self.discard()
        return value, None

    def discard(self, keep: str | None = None) -> None:
        """Delete what this attempt stored (all but ``keep``). A failed delete is left to the
        orphan sweep: the job row never references these files."""
        for stored in [s for s in self.written if s.key != keep]:
            self.written.remove(stored)
            delete_quietly(self.store, stored.key, self.job.log_context)


def delete_quietly(store: ResultStore | None, key: str, context: dict[str, Any]) -> bool:
    if store is None:
        return False
    try:
        store.delete(key)
    except Exception:
        log.warning("could not delete a stored result; the orphan sweep will", extra=context,
                    exc_info=True)
        return False
    return True
