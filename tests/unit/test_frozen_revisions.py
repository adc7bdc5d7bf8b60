"""The revisions under models/db/migrations/versions are history: never edited once merged.

A database that already ran a revision never runs it again: an edit would reach only the
databases still behind it, and the fleet would silently split in two schemas. The sha256
of every revision file is kept in ``versions/FROZEN`` (``sha256sum -c FROZEN`` reads it too).
"""

from __future__ import annotations

import hashlib
import re

import pytest

from spacejobs.models.db.migrate import MIGRATIONS

VERSIONS = MIGRATIONS / "versions"
MANIFEST = VERSIONS / "FROZEN"
REVISION_FILE = re.compile(r"\d{4}_\w+\.(py|sql)")


def on_disk() -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(VERSIONS.iterdir()) if REVISION_FILE.fullmatch(path.name)}


def frozen() -> dict[str, str]:
    digests = {}
    for line in MANIFEST.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        digests[name] = digest
    return digests


def test_no_frozen_revision_file_was_edited_or_removed():
    found = on_disk()
    changed = sorted(name for name, digest in frozen().items() if found.get(name) != digest)
    if changed:
        pytest.fail(
            f"frozen revision files changed or removed: {', '.join(changed)}.\n"
            "Databases that ran them never run them again, so an edit splits the fleet in two\n"
            "schemas. Restore them (git checkout main -- models/db/migrations/versions/) and add\n"
            "a NEW revision: 000N_name.py + 000N_name.sql, its lines in FROZEN, and the same change\n"
            "made in the schema file that holds the object (models/db/migrate.py, models/db/schema/).\n"
            "(Only a revision that main does not have yet may change; then update its line.)",
            pytrace=False)


def test_every_revision_file_is_in_the_manifest():
    listed = frozen()
    new = {name: digest for name, digest in on_disk().items() if name not in listed}
    if new:
        pytest.fail(
            "revision files missing from models/db/migrations/versions/FROZEN. Once the revision\n"
            "is final, add these lines (and make the same change in models/db/schema/):\n"
            + "".join(f"{digest}  {name}\n" for name, digest in new.items()),
            pytrace=False)
