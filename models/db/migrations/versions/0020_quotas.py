"""Quotas: a cap on each organization's active jobs (per kind too), enforced inside the submit functions.

Revision ID: 0020
Revises: 0019

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: 0020 replaces the submit functions; the old ones "
                              "are in revision 0005")
