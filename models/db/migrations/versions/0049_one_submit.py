"""One submit: a single submit is a batch of one. submit_jobs() answers each job of a request
by its place (created, debounced, replayed, duplicate) and takes a single submit's options (an
Idempotency-Key, a debounce, a retry's origin); submit_job() becomes the previous release's
batch of one, for a rolling deploy.

Revision ID: 0049
Revises: 0048

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0049"
down_revision = "0048"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: the SQL bodies are not rebuilt")
