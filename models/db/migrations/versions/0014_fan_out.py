"""Durable fan-out: parent and child jobs, spawned and read by the worker holding the parent's lease.

Revision ID: 0014
Revises: 0013

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: 0014 adds columns that rows now use")
