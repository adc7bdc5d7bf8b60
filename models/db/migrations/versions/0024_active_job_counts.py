"""An organization's active jobs counted by the jobs triggers, not on every submit.

Revision ID: 0024
Revises: 0023

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: 0024 replaces the jobs triggers and the quota's "
                              "count; the revisions before it hold their previous versions")
