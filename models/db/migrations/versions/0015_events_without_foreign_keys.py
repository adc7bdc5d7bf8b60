"""Job events without foreign keys: they are written only from their job's row, and go with it by trigger.

Revision ID: 0015
Revises: 0014

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: 0015 drops foreign keys that rows since may break")
