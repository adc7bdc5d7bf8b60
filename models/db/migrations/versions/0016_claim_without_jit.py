"""The claim without JIT: compiling it cost more than running it, and grew with the queue.

Revision ID: 0016
Revises: 0015

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    op.execute("ALTER FUNCTION claim_jobs(text, integer, text[], text, uuid) RESET jit")
