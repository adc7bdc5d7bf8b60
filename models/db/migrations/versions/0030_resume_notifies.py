"""resume_due_waits() notifies the workers that LISTEN.

Revision ID: 0030
Revises: 0029

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: 0029's resume_due_waits() works the same, "
                              "only without the NOTIFY")
