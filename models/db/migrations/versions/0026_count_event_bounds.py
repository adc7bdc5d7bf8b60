"""count_event() counts only a positive, finite amount under a kind's name.

Revision ID: 0026
Revises: 0025

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: 0026 replaces count_event(); revision 0003 holds "
                              "its previous version")
