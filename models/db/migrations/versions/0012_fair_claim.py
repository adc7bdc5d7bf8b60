"""Fair claiming: organizations in turn around a ring, shares by weight, priority within an organization.

Revision ID: 0012
Revises: 0008

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0012"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: 0012 replaces the claim function")
