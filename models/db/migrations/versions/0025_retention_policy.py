"""Retention ages held by the database (retention_policy), not chosen by the purge's caller.

Revision ID: 0025
Revises: 0024

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: 0025 replaces the purge functions; the revisions "
                              "before it hold their previous versions")
