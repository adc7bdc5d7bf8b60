"""The indexes of held leases are built on lease_until, so that a lookup of a job by its id
and lease token reads jobs_pkey, never an index a long-open transaction fills.

Revision ID: 0053
Revises: 0052

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0053"
down_revision = "0052"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: the SQL bodies are not rebuilt")
