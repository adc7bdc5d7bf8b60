"""The claim updates the rows it locked by row version (ctid), not by a second probe of the primary key.

Revision ID: 0017
Revises: 0016

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup, or re-run the claim_jobs of revision 0012 and 0016")
