"""Least privilege: column grants, no deletes, events only from the triggers, the claim as a function.

Revision ID: 0006
Revises: 0005

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: 0006 narrows privileges; widening them again "
                              "by script is not offered")
