"""The results store: a small interface (put, open, delete, list) and its local-directory form.

The store keeps bytes; the job row says what they are (content type, file name, size: see
:class:`~models.results.records.StoredResult`) and is the only thing that names a file. Keys are
``<organization id>/<job id>/<128 random bits>``: not derivable from a job id, and never taken
from a client. The web opens the key its row holds, after the membership check.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, BinaryIO, Protocol
from uuid import UUID

from spacejobs.models.errors import ResultMissing

_IDS = (r"(?P<org>[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12})/"
        r"(?P<job>[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12})/")
#: a key this code made: organization id / job id / random part
KEY = re.compile(rf"^{_IDS}[A-Za-z0-9_-]{{22}}$")
#: what an interrupted local put leaves behind (LocalResultStore.put's temporary file)
PARTIAL = re.compile(rf"^{_IDS}\.[A-Za-z0-9_-]{{22}}\.[A-Za-z0-9_]+\.part$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")

CHUNK = 64 * 1024

#: what a put reads: bytes, or a binary file read to its end (a SpooledTemporaryFile too)
Source = bytes | IO[bytes]


def new_key(organization_id: UUID, job_id: UUID) -> str:
    """A fresh key for one attempt's file (a retry gets another, so attempts never collide)."""
    return f"{organization_id}/{job_id}/{secrets.token_urlsafe(16)}"


def job_of(key: str) -> UUID | None:
    """The job a key belongs to; None for a name this code did not make."""
    found = KEY.match(key)
    return UUID(found["job"]) if found else None


def is_partial(key: str) -> bool:
    return PARTIAL.match(key) is not None


def belongs_to(key: str, organization_id: UUID, job_id: UUID) -> bool:
    found = KEY.match(key)
    return found is not None and (found["org"], found["job"]) == (str(organization_id), str(job_id))


@dataclass(frozen=True)
class StoredObject:
    """One object as the store lists it."""

    key: str
    size: int
    modified_at: datetime


@dataclass
class StoredFile:
    """An opened object: read ``stream`` (in chunks), then close it."""

    stream: BinaryIO
    size: int
    content_type: str | None = None

    def chunks(self, size: int = CHUNK) -> Iterator[bytes]:
        try:
            while chunk := self.stream.read(size):
                yield chunk
        finally:
            self.stream.close()


class ResultStore(Protocol):
    """Where large results live. Every method may be called by many processes on many hosts."""

    def put(self, key: str, source: Source, *, content_type: str) -> int:
        """Write the whole object (complete or not at all under ``key``); returns its size."""
        ...

    def open(self, key: str) -> StoredFile:
        """The object for reading; :class:`ResultMissing` when there is none."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object; removing one that is not there is no error."""
        ...

    def list(self) -> Iterator[StoredObject]:
        """Every object in the store, half-written leftovers included (the orphan sweep)."""
        ...


class CountingReader:
    """A reader that counts what passes through (the size of a streamed put)."""

    def __init__(self, source: Source) -> None:
        self._source = source
        self._offset = 0
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        if isinstance(self._source, bytes | bytearray | memoryview):
            end = len(self._source) if size is None or size < 0 else self._offset + size
            chunk = bytes(self._source[self._offset:end])
            self._offset += len(chunk)
        else:
            chunk = self._source.read(size)
        self.count += len(chunk)
        return chunk


class LocalResultStore:
    """A directory (``SPACEJOBS_RESULTS_DIR``) shared by web, workers and beat: on one host, or
    a shared filesystem for several. A put writes a temporary file beside its target and renames
    it, so a reader never sees half an object; a put interrupted by a crash leaves a ``.part``
    file that the orphan sweep removes after its grace period."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).expanduser().resolve()

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not parts or not all(_NAME.match(p) and p not in (".", "..") for p in parts):
            raise ValueError("not a key of this store")
        return self.root.joinpath(*parts)

    def put(self, key: str, source: Source, *, content_type: str) -> int:
        target = self._path(key)
        reader = CountingReader(source)
        for attempt in (1, 2):
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 (renamed below, not closed by a with)
                    dir=target.parent, prefix=f".{target.name}.", suffix=".part", delete=False)
            except FileNotFoundError:
                if attempt == 2:
                    raise
                continue  # a delete of the job's last file removed the folder meanwhile
            break
        try:
            with handle:
                shutil.copyfileobj(reader, handle, CHUNK)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(handle.name, target)
        except BaseException:
            Path(handle.name).unlink(missing_ok=True)
            raise
        return reader.count

    def open(self, key: str) -> StoredFile:
        path = self._path(key)
        try:
            stream = path.open("rb")
        except FileNotFoundError:
            raise ResultMissing() from None
        return StoredFile(stream, os.fstat(stream.fileno()).st_size)

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        # Empty job and organization folders go too, so the tree does not grow forever.
        for folder in (path.parent, path.parent.parent):
            if folder == self.root:
                break
            try:
                folder.rmdir()
            except OSError:
                break  # not empty (another attempt's file), or already gone

    def list(self) -> Iterator[StoredObject]:
        for folder, _dirs, files in os.walk(self.root):
            for name in sorted(files):
                path = Path(folder, name)
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue  # deleted while we walked
                yield StoredObject(path.relative_to(self.root).as_posix(), stat.st_size,
                                   datetime.fromtimestamp(stat.st_mtime, UTC))

