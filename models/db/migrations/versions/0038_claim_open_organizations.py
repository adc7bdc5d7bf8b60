"""claim_jobs(): an organization whose queued jobs are all held back takes no share of a claim.

Revision ID: 0038
Revises: 0037

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0038"
down_revision = "0037"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: the SQL bodies are not rebuilt")
