"""The claim plans once per session and only through its indexes, whatever the table holds.

Revision ID: 0023
Revises: 0022

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    for setting in ("enable_seqscan", "enable_bitmapscan", "plan_cache_mode"):
        op.execute(f"ALTER FUNCTION claim_jobs(text, integer, text[], text, uuid) RESET {setting}")
