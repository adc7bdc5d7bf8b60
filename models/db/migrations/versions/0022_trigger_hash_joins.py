"""The statement trigger of job updates joins its transition tables by hash, not by nested loop.

Revision ID: 0022
Revises: 0021

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    op.execute("ALTER FUNCTION jobs_after_update() RESET enable_nestloop")
    op.execute("ALTER FUNCTION jobs_after_update() RESET jit")
