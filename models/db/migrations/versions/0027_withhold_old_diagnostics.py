"""Diagnostics recorded before exception messages were left out are withheld.

Revision ID: 0027
Revises: 0026

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("the withheld text is gone: restore a backup to see it again")
