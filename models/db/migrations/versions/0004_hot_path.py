"""The hot path: statement-level event and metric triggers, the batch standing check, NOTIFY.

Revision ID: 0004
Revises: 0003

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: the row-level triggers of 0001/0003 are not rebuilt")
