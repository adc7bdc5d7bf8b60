"""wait_job() takes how many children the caller saw active.

Revision ID: 0031
Revises: 0030

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: 0030's wait_job() takes a boolean, and "
                              "the workers of this revision pass a count")
