"""claim_jobs() reads no history: each (organization, priority) key has a head where its queued
jobs begin (claim_heads), moved forward by beat and back by the jobs triggers; expired leases
are left to the sweeper.

Revision ID: 0048
Revises: 0047

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0048"
down_revision = "0047"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: the SQL bodies are not rebuilt")
