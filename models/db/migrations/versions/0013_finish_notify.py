"""Finishes notify: a job that ends says so (spacejobs_finished), for the Python API's wait().

Revision ID: 0013
Revises: 0012

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: 0013 replaces the update trigger")
