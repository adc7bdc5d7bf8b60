"""submit_job() is called by name: its optional arguments default to NULL.

Revision ID: 0028
Revises: 0027

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: removing the defaults needs DROP + CREATE of "
                              "submit_job(), and 0027's callers work with them in place")
